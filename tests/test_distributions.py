"""Three installables from one repository: the agent's and the client's wheels hold only their own code, and the agent
installs into a fresh venv from its wheel without any of the server's dependencies (DESIGN.md section 1)."""
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

sys.path.insert(0, str(REPO / "distributions"))
from build import build  # noqa: E402

sys.path.remove(str(REPO / "distributions"))


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    built = build(out, ("agent", "client", "server"))
    return {path.name.split("-")[0].removeprefix("kiln_"): path for path in built}


def _requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(name for name in archive.namelist() if name.endswith(".dist-info/METADATA"))
        return [line.split(":", 1)[1].strip() for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]


def test_the_three_distributions_share_one_version_and_the_server_requires_the_other_two():
    projects = {name: tomllib.loads(path.read_text())["project"] for name, path in
                {"server": REPO / "pyproject.toml", "agent": REPO / "distributions/agent/pyproject.toml",
                 "client": REPO / "distributions/client/pyproject.toml"}.items()}
    versions = {project["version"] for project in projects.values()}
    assert len(versions) == 1, versions
    version = versions.pop()
    assert f"kiln-agent=={version}" in projects["server"]["dependencies"] and f"kiln-client=={version}" in projects["server"]["dependencies"]
    assert f"kiln-agent=={version}" in projects["client"]["dependencies"]
    assert "tensorrt" not in projects["server"].get("optional-dependencies", {})


def test_the_agent_wheel_holds_devices_and_requires_only_its_runtime_and_http(wheels):
    with zipfile.ZipFile(wheels["agent"]) as archive:
        tops = {name.split("/")[0] for name in archive.namelist() if not name.split("/")[0].endswith(".dist-info")}
        assert tops == {"devices"}
        assert "devices/agent/runner.py" in archive.namelist() and "devices/support.py" in archive.namelist()
    required = {requirement.split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower() for requirement in _requires(wheels["agent"])
                if "extra ==" not in requirement}
    assert required == {"numpy", "requests", "psutil", "onnx", "onnxruntime"}


def test_the_client_wheel_holds_only_the_clients_modules(wheels):
    with zipfile.ZipFile(wheels["client"]) as archive:
        modules = {name for name in archive.namelist() if not name.split("/")[0].endswith(".dist-info")}
    assert modules == {"kiln/__init__.py", "kiln/client.py", "kiln/cli.py", "kiln/package_run.py"}
    assert not any(requirement.lower().startswith(("django", "celery", "psycopg")) for requirement in _requires(wheels["client"]))


def test_the_server_and_client_wheels_together_make_the_whole_kiln_package_without_overlap(wheels):
    def top_modules(wheel: Path) -> set[str]:
        with zipfile.ZipFile(wheel) as archive:
            return {name for name in archive.namelist() if name.count("/") == 1 and name.startswith(("kiln/", "devices/", "workers/"))}

    server, client = top_modules(wheels["server"]), top_modules(wheels["client"])
    assert not server & client
    assert server | client == {f"kiln/{path.name}" for path in (REPO / "platform" / "kiln").glob("*.py")} | {
        f"workers/{path.name}" for path in (REPO / "workers").glob("*.py")}
    with zipfile.ZipFile(wheels["server"]) as archive:
        assert "kiln/settings.py" in archive.namelist() and "kiln/pipeline/support.py" in archive.namelist()
        assert not any(name.startswith("devices/") for name in archive.namelist())


@pytest.mark.skipif(not (WHEELHOUSE / ".downloaded").exists(), reason="no offline wheelhouse for the agent's dependencies: `make install` downloads it")
def test_the_agent_installs_into_a_fresh_venv_without_server_dependencies_and_runs_there(wheels, tmp_path):
    venv = tmp_path / "device"
    # No PYTHONPATH anywhere below: the tree's own packages must not be what pip or the agent finds.
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "KILN_AGENT_BACKENDS": "onnxruntime"}
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120, env=env)
    python = venv / "bin" / "python"
    # The wheel's own requirements, resolved from the offline wheelhouse only: a server dependency would not resolve.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-compile", "--no-index",
                    "--find-links", str(WHEELHOUSE), str(wheels["agent"])], check=True, timeout=600, capture_output=True, env=env, cwd=tmp_path)
    listed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "list", "--format", "json"], check=True, capture_output=True,
                            text=True, timeout=120, env=env, cwd=tmp_path)
    installed = {row["name"].lower() for row in json.loads(listed.stdout)}
    assert "kiln-agent" in installed and "onnxruntime" in installed
    assert not installed & SERVER_ONLY, installed & SERVER_ONLY

    # Run from elsewhere: only the installed wheel is importable.
    capabilities = subprocess.run([str(venv / "bin" / "kiln-agent"), "capabilities"], cwd=tmp_path, env=env, check=True, capture_output=True,
                                  text=True, timeout=120)
    assert json.loads(capabilities.stdout)["runtimes"]["onnxruntime"]
    probe = ("import sys, devices.agent.loop, devices.agent.runner, devices.support; "
             "assert not {'django', 'kiln', 'workers', 'celery'} & set(sys.modules), sorted(sys.modules); print(devices.agent.runner.__file__)")
    ran = subprocess.run([str(python), "-P", "-c", probe], cwd=tmp_path, env=env, check=True, capture_output=True, text=True, timeout=120)
    assert str(venv) in ran.stdout
