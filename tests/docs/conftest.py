"""The documentation site built once per test session, as `make docs` builds it (strictly), into a folder of the test's."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of one configuration into `site`, with the environment `make docs` gives it."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
                          cwd=config.parent, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="session")
def built_site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("docs-site") / "site"
    result = mkdocs_build(REPO / "mkdocs.yml", site)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return site
