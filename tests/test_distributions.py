"""Four installables from one repository, one import package each, each from a top-level folder of its own: the contract
(kiln_contract), the agent (devices), the client (kiln_client) and the server (kiln and workers). The agent and the client
each install into a fresh venv from their wheels offline, the agent without any of the server's dependencies and the
client without a runtime (DESIGN.md section 1)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
WHEELHOUSE = REPO / "var" / "wheelhouse"
SERVER_ONLY = {"django", "djangorestframework", "celery", "psycopg", "psycopg-binary", "scipy", "h5py", "kiln-server", "kiln-client",
               "gunicorn", "uvicorn", "redis", "torch", "nncf"}
RUNTIMES = {"onnxruntime", "onnx", "openvino", "ai-edge-litert", "tensorflow", "torch", "kiln-agent"}
# Each distribution's project, and the one import package its wheel holds (the server's: two).
PROJECTS = {"contract": REPO / "distributions/contract/pyproject.toml", "agent": REPO / "distributions/agent/pyproject.toml",
            "client": REPO / "distributions/client/pyproject.toml", "server": REPO / "pyproject.toml"}
PACKAGES = {"contract": {"kiln_contract": REPO / "kiln_contract"}, "agent": {"devices": REPO / "devices"},
            "client": {"kiln_client": REPO / "kiln_client"}, "server": {"kiln": REPO / "platform" / "kiln", "workers": REPO / "workers"}}

sys.path.insert(0, str(REPO / "distributions"))
from build import build  # noqa: E402

sys.path.remove(str(REPO / "distributions"))


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    built = build(out, ("contract", "agent", "client", "server"))
    return {path.name.split("-")[0].removeprefix("kiln_"): path for path in built}


def _requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        return [line.split(":", 1)[1].strip() for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]


def _required_names(wheel: Path) -> set[str]:
    return {requirement.split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower() for requirement in _requires(wheel)
            if "extra ==" not in requirement}


def _modules(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {name for name in archive.namelist() if not name.split("/")[0].endswith(".dist-info")}


def _fresh_venv(tmp_path: Path, name: str) -> tuple[Path, dict[str, str]]:
    venv = tmp_path / name
    # No PYTHONPATH anywhere below: the tree's own packages must not be what pip or the installed commands find.
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "KILN_AGENT_BACKENDS": "onnxruntime"}
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120, env=env)
    return venv, env


def _install_offline(venv: Path, env: dict[str, str], wheel: Path, tmp_path: Path) -> set[str]:
    """The wheel's own requirements, resolved from the offline wheelhouse and the tree's own wheels only: a requirement
    that is in neither (a server dependency, a runtime) would not resolve. Returns what the venv then holds."""
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet", "--no-compile", "--no-index",
                    "--find-links", str(WHEELHOUSE), "--find-links", str(wheel.parent), str(wheel)],
                   check=True, timeout=600, capture_output=True, env=env, cwd=tmp_path)
    listed = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "list", "--format", "json"], check=True,
                            capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    return {row["name"].lower() for row in json.loads(listed.stdout)}


def test_the_four_distributions_share_one_version_and_each_requires_the_contract():
    projects = {name: tomllib.loads(path.read_text())["project"] for name, path in PROJECTS.items()}
    versions = {project["version"] for project in projects.values()}
    assert len(versions) == 1, versions
    version = versions.pop()
    assert {f"kiln-contract=={version}", f"kiln-agent=={version}", f"kiln-client=={version}"} <= set(projects["server"]["dependencies"])
    assert f"kiln-contract=={version}" in projects["agent"]["dependencies"] and f"kiln-contract=={version}" in projects["client"]["dependencies"]
    assert not any(requirement.startswith("kiln-") for requirement in projects["contract"]["dependencies"])
    assert "tensorrt" not in projects["server"].get("optional-dependencies", {})


def test_the_contract_wheel_holds_kiln_contract_and_requires_numpy_and_requests_only(wheels):
    assert {name.split("/")[0] for name in _modules(wheels["contract"])} == {"kiln_contract"}
    assert "kiln_contract/metrics.py" in _modules(wheels["contract"]) and "kiln_contract/http.py" in _modules(wheels["contract"])
    assert _required_names(wheels["contract"]) == {"numpy", "requests"}


def test_the_agent_wheel_holds_devices_and_requires_only_the_contract_its_runtime_and_http(wheels):
    modules = _modules(wheels["agent"])
    assert {name.split("/")[0] for name in modules} == {"devices"}
    assert "devices/agent/runner.py" in modules and "devices/support.py" in modules
    assert _required_names(wheels["agent"]) == {"kiln-contract", "numpy", "requests", "psutil", "onnx", "onnxruntime"}


def test_the_client_wheel_holds_kiln_client_and_requires_no_runtime_and_nothing_of_the_server(wheels):
    modules = _modules(wheels["client"])
    assert {name.split("/")[0] for name in modules} == {"kiln_client"}
    assert {"kiln_client/__init__.py", "kiln_client/client.py", "kiln_client/cli.py", "kiln_client/package_run.py"} <= modules
    required = _required_names(wheels["client"])
    assert "kiln-contract" in required and not required & (RUNTIMES | SERVER_ONLY), required & (RUNTIMES | SERVER_ONLY)


def test_each_import_package_ships_whole_in_exactly_one_wheel(wheels):
    tops = {name: {module.split("/")[0] for module in _modules(wheel)} for name, wheel in wheels.items()}
    for name, packages in PACKAGES.items():
        assert tops[name] == set(packages), (name, tops[name])
        shipped = {module for module in _modules(wheels[name]) if module.endswith(".py") and "/migrations/" not in module}
        in_tree = {f"{package}/{path.relative_to(folder)}" for package, folder in packages.items() for path in folder.rglob("*.py")
                   if "migrations" not in path.parts}
        assert shipped == in_tree, (name, sorted(shipped ^ in_tree)[:10])
    with zipfile.ZipFile(wheels["server"]) as archive:
        assert "kiln/settings.py" in archive.namelist() and "kiln/pipeline/support.py" in archive.namelist()


@pytest.mark.skipif(not (WHEELHOUSE / ".downloaded").exists(), reason="no offline wheelhouse for the agent's and client's dependencies: `make install` downloads it")
def test_the_agent_installs_into_a_fresh_venv_without_server_dependencies_and_runs_there(wheels, tmp_path):
    venv, env = _fresh_venv(tmp_path, "device")
    installed = _install_offline(venv, env, wheels["agent"], tmp_path)
    assert {"kiln-agent", "kiln-contract", "onnxruntime"} <= installed
    assert not installed & SERVER_ONLY, installed & SERVER_ONLY

    # Run from elsewhere: only the installed wheels are importable.
    capabilities = subprocess.run([str(venv / "bin" / "kiln-agent"), "capabilities"], cwd=tmp_path, env=env, check=True, capture_output=True,
                                  text=True, timeout=120)
    assert json.loads(capabilities.stdout)["runtimes"]["onnxruntime"]
    probe = ("import sys, devices.agent.loop, devices.agent.runner, devices.support; "
             "assert not {'django', 'kiln', 'kiln_client', 'workers', 'celery'} & set(sys.modules), sorted(sys.modules); "
             "print(devices.agent.runner.__file__)")
    ran = subprocess.run([str(venv / "bin" / "python"), "-P", "-c", probe], cwd=tmp_path, env=env, check=True, capture_output=True, text=True, timeout=120)
    assert str(venv) in ran.stdout


@pytest.mark.skipif(not (WHEELHOUSE / ".downloaded").exists(), reason="no offline wheelhouse for the agent's and client's dependencies: `make install` downloads it")
def test_the_client_installs_into_a_fresh_venv_without_a_runtime_and_the_kiln_command_runs_there(wheels, tmp_path):
    venv, env = _fresh_venv(tmp_path, "laptop")
    installed = _install_offline(venv, env, wheels["client"], tmp_path)
    assert {"kiln-client", "kiln-contract", "click", "rich", "cryptography", "numpy", "requests"} <= installed
    assert not installed & (RUNTIMES | (SERVER_ONLY - {"kiln-client"})), installed & (RUNTIMES | SERVER_ONLY)

    help_text = subprocess.run([str(venv / "bin" / "kiln"), "--help"], cwd=tmp_path, env=env, check=True, capture_output=True, text=True, timeout=120)
    assert "login" in help_text.stdout and "deploy" in help_text.stdout
    # The client, its command line and the package verifier load from the wheels alone; `kiln` (the server's package,
    # whose `kiln.Client` re-exports this one) is not there.
    probe = ("import sys, kiln_client, kiln_client.cli, kiln_client.package_run; kiln_client.Client; "
             "assert not {'django', 'kiln', 'workers', 'devices', 'onnxruntime', 'openvino'} & set(sys.modules), sorted(sys.modules); "
             "print(kiln_client.__file__)")
    ran = subprocess.run([str(venv / "bin" / "python"), "-P", "-c", probe], cwd=tmp_path, env=env, check=True, capture_output=True, text=True, timeout=120)
    assert str(venv) in ran.stdout
    missing = subprocess.run([str(venv / "bin" / "python"), "-P", "-c", "import kiln"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode != 0 and "No module named 'kiln'" in missing.stderr
