"""No import cycle among Kiln's modules, counting the imports inside functions.

A function-local import hides a cycle from Python (the module is complete by the time the function runs) but not from a
reader: two modules that import each other are one module to change. Every first-party module's imports are read from
its bytecode (tests/imports_of.py; CPython's ast is not thread-safe in the test process), at module level and inside
functions alike, and the strongly connected components of that graph must all be single modules. A cycle is broken by
moving what both sides share to its owner, not by importing later.

The modules that once hid a cycle or an upward import behind a function-local import also import first in a fresh
interpreter.
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.imports_of import imported_modules, modules_under, strongly_connected_components

REPO = Path(__file__).resolve().parents[1]
# Every first-party import package: its import name and its folder.
PACKAGES = {"kiln": REPO / "platform" / "kiln", "workers": REPO / "workers", "devices": REPO / "devices", "kiln_contract": REPO / "kiln_contract",
            "kiln_client": REPO / "kiln_client", "tests": REPO / "tests"}
# The installables that ship without the server, and the only first-party packages each may import (DESIGN.md section 1:
# the agent imports neither Django, kiln nor workers; the contract imports nothing of Kiln; the client needs no agent).
MAY_IMPORT = {"kiln_contract": set(), "kiln_client": {"kiln_contract"}, "devices": {"kiln_contract"}}
# Modules that hid a cycle or an upward import behind a function-local import before; each must import first.
ONCE_HIDDEN = ["kiln.reports.selectors", "kiln.reports.services", "kiln.pipeline.stages", "kiln.pipeline.selectors",
               "kiln.pipeline.retime", "kiln_client.cli", "kiln_client.client", "workers.quantize.search", "workers.quantize.verdicts", "workers.scoring",
               "workers.quantize.variants", "workers.quantize.streaming", "workers.quantize.calibration_methods", "workers.learned.recipes",
               "devices.support", "devices.backends.registry", "devices.agent.client", "kiln_contract.resumable"]


def import_graph(packages: dict[str, Path]) -> tuple[dict[str, set[str]], dict[tuple[str, str], list[str]]]:
    """Module -> the modules it imports; and for each edge, where its imports are ("path:line in function")."""
    modules = modules_under(packages)
    graph: dict[str, set[str]] = {module: set() for module in modules}
    where: dict[tuple[str, str], list[str]] = {}
    for module, (path, is_package) in modules.items():
        for target, statement in imported_modules(module, path, is_package, modules):
            graph[module].add(target)
            shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
            where.setdefault((module, target), []).append(f"{shown}:{statement.line} in {statement.where}")
    return graph, where


@functools.cache
def repository_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], list[str]]]:
    return import_graph(PACKAGES)


def cycles(packages: dict[str, Path]) -> list[str]:
    """Each strongly connected component of more than one module, with the imports that bind it."""
    graph, where = repository_graph() if packages is PACKAGES else import_graph(packages)
    found = []
    for component in strongly_connected_components(graph):
        if len(component) > 1:
            inside = [f"  {module} -> {target} ({'; '.join(where[module, target])})"
                      for module in component for target in sorted(graph[module] & set(component))]
            found.append("\n".join([f"{len(component)} modules import each other:", *inside]))
    return found


def test_every_top_level_package_is_in_the_graph():
    folders = {path.parent.name for path in REPO.glob("*/__init__.py")}
    assert folders <= set(PACKAGES), f"add {sorted(folders - set(PACKAGES))} to PACKAGES"


def test_no_two_modules_import_each_other_even_inside_functions():
    found = cycles(PACKAGES)
    assert not found, "\n\n".join(found)


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_a_package_that_ships_without_the_server_imports_only_what_it_may(package):
    graph, where = repository_graph()
    reached = [f"{module} -> {target} ({'; '.join(where[module, target])})" for module in sorted(graph) if module.split(".")[0] == package
               for target in sorted(graph[module]) if target.split(".")[0] not in {package, *MAY_IMPORT[package]}]
    assert not reached, "\n".join(reached)


def test_a_cycle_hidden_in_a_function_and_a_relative_import_is_found(tmp_path):
    package = tmp_path / "toy"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "inner" / "__init__.py").write_text("from toy.inner.leaf import VALUE\n")
    (package / "inner" / "leaf.py").write_text("VALUE = 1\n")
    (package / "shapes.py").write_text("from toy.inner import VALUE\n\n\ndef build():\n    from .builders import make\n    return make()\n")
    (package / "builders.py").write_text("from toy import shapes\n\n\ndef make():\n    return shapes\n")
    graph, _ = import_graph({"toy": package})
    assert graph["toy.shapes"] == {"toy.inner", "toy.builders"} and graph["toy.builders"] == {"toy.shapes"}
    # A package that re-exports its submodule is not a cycle with it.
    assert graph["toy.inner"] == {"toy.inner.leaf"} and graph["toy.inner.leaf"] == set()
    found = cycles({"toy": package})
    assert len(found) == 1 and "toy.builders -> toy.shapes" in found[0] and "in build" in found[0]


@pytest.mark.parametrize("module", ONCE_HIDDEN)
def test_the_module_imports_first_in_a_fresh_interpreter(module):
    setup = "import django; django.setup(); " if module.startswith("kiln.") else ""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "kiln.settings",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "platform"), os.environ.get("PYTHONPATH", "")])}
    ran = subprocess.run([sys.executable, "-c", f"{setup}import {module}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
