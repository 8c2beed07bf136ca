"""Build the contract's, the agent's and the client's wheels into a folder: what the server serves at /downloads/.

    python distributions/build.py dist/              # kiln-contract, kiln-agent and kiln-client
    python distributions/build.py dist/ --server     # and kiln-server
    python distributions/build.py dist/ --isolated   # build each in a fresh environment (needs the index; the Docker image)

Each project's build/ folder is removed before and after, so that a module deleted from the tree never ships from a
stale copy; a folder holds one wheel per distribution (an older one is replaced).
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PROJECTS = {"contract": HERE / "contract", "agent": HERE / "agent", "client": HERE / "client", "server": REPO}
# What a device or a laptop installs from the server; kiln-server is built only on request.
SERVED = ("contract", "agent", "client")


def _clean(project: Path) -> None:
    shutil.rmtree(project / "build", ignore_errors=True)
    # setuptools leaves NAME.egg-info beside the sources; on a PYTHONPATH it would pass for an installed distribution.
    for folder in (project, project / "platform"):
        for info in folder.glob("kiln_*.egg-info"):
            shutil.rmtree(info, ignore_errors=True)


def build(out_dir: Path, names: tuple[str, ...] = SERVED, *, isolated: bool = False) -> list[Path]:
    """Build the named distributions' wheels into `out_dir`; returns every kiln wheel there."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        project = PROJECTS[name]
        for old in out_dir.glob(f"kiln_{name}-*.whl"):
            old.unlink()
        _clean(project)
        command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(out_dir), str(project)]
        if not isolated:
            command.insert(4, "--no-build-isolation")
        try:
            subprocess.run(command, check=True)
        finally:
            _clean(project)
    return sorted(out_dir.glob("kiln_*.whl"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--server", action="store_true", help="build kiln-server's wheel too")
    parser.add_argument("--isolated", action="store_true", help="use pip's build isolation")
    args = parser.parse_args()
    names = (*SERVED, "server") if args.server else SERVED
    for wheel in build(args.out_dir, names, isolated=args.isolated):
        print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
