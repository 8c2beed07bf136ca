"""The deployment files stay valid: docker-compose accepts the stack description; .gitignore ignores linked environments."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent


def compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return None


@pytest.mark.skipif(compose_command() is None, reason="neither docker-compose nor the docker compose plugin is installed (.ci/run installs docker-compose)")
def test_docker_compose_accepts_the_stack():
    env = {**os.environ, "KILN_SECRET_KEY": "x" * 50, "MINIO_ROOT_PASSWORD": "y" * 40}
    result = subprocess.run([*compose_command(), "config"], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    for service in ("postgres", "redis", "minio", "minio-bucket", "web", "worker-control", "worker-build", "worker-check", "agent"):
        assert f"  {service}:" in result.stdout
    # Each work class has its own worker (workers/routing.py): nothing consumes every queue at once.
    services = yaml.safe_load(result.stdout)["services"]
    queues = {name: service["command"][service["command"].index("--queues") + 1] for name, service in services.items()
              if name.startswith("worker")}
    assert queues == {"worker-control": "control,kiln", "worker-build": "build", "worker-check": "check"}
    assert "KILN_S3_ENDPOINT_URL: http://minio:9000" in result.stdout


def test_docker_compose_refuses_to_start_minio_without_a_password():
    if compose_command() is None:
        pytest.skip("neither docker-compose nor the docker compose plugin is installed")
    env = {key: value for key, value in os.environ.items() if key != "MINIO_ROOT_PASSWORD"}
    result = subprocess.run([*compose_command(), "config"], cwd=REPO, env={**env, "KILN_SECRET_KEY": "x" * 50}, capture_output=True, text=True)
    assert result.returncode != 0 and "MINIO_ROOT_PASSWORD" in result.stderr


def test_platform_is_not_a_package():
    """A package named `platform` would shadow the standard library module (DESIGN.md section 1)."""
    assert not (REPO / "platform" / "__init__.py").exists()


@pytest.mark.parametrize("path", [".venv", ".nodeenv", "frontend/node_modules", "var"])
def test_gitignore_ignores_a_symlinked_environment(tmp_path, path):
    """A worktree links .venv (or node_modules, .nodeenv, var) to a shared copy; a pattern ending in "/" would miss the link."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    shutil.copyfile(REPO / ".gitignore", repo / ".gitignore")
    (tmp_path / "target").mkdir()
    link = repo / path
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(tmp_path / "target", target_is_directory=True)
    result = subprocess.run(["git", "check-ignore", "-v", path], cwd=repo, capture_output=True, text=True)
    assert result.returncode == 0, f"{path} (a symlink) is not ignored: {result.stdout}{result.stderr}"
