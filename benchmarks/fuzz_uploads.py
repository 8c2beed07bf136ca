"""Fuzz every upload parser for longer than the test suite does: `python benchmarks/fuzz_uploads.py --minutes 30`.

Runs tests/platform/security/test_fuzz_uploads.py with KILN_FUZZ_MINUTES set, so that each target (the web-side
parsers and every upload the API takes: ONNX, .pt2, TorchScript, zipped models, npz, HDF5, images, WAV, text,
recipes, tus headers) draws fresh Hypothesis examples for its share of the time, on the test database. Prints, per
target, how many examples ran and what the server answered (a web-side parser's "ok", the API's status codes), and
how much the web process grew; a 500, a non-JSON error or growth past the bound fails the run with the falsifying
input. Not a speed benchmark: it prints counts, not timings to compare.

Needs the services the test suite uses (PostgreSQL, Redis) and the same environment (DATABASE_URL, REDIS_URL,
KILN_DATA_DIR); `-k NAME` narrows it to targets whose name matches.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="the whole run's length, shared between the targets")
    parser.add_argument("-k", dest="select", help="only targets whose name matches (pytest's -k)")
    args = parser.parse_args()
    env = {**os.environ, "KILN_FUZZ_MINUTES": str(args.minutes),
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "platform"), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "pytest", "tests/platform/security/test_fuzz_uploads.py", "-s", "-q", "-p", "no:cacheprovider",
               *(["-k", args.select] if args.select else [])]
    return subprocess.run(command, check=False, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
