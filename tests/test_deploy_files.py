"""The deployment files stay valid: docker-compose accepts the stack description."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return None


@pytest.mark.skipif(compose_command() is None, reason="neither docker-compose nor the docker compose plugin is installed (.ci/run installs docker-compose)")
def test_docker_compose_accepts_the_stack():
    env = {**os.environ, "KILN_SECRET_KEY": "x" * 50}
    result = subprocess.run([*compose_command(), "config"], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    for service in ("postgres", "redis", "web", "worker", "agent"):
        assert f"  {service}:" in result.stdout


def test_platform_is_not_a_package():
    """A package named `platform` would shadow the standard library module (DESIGN.md section 1)."""
    assert not (REPO / "platform" / "__init__.py").exists()
