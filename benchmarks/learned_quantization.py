"""The learned-INT8 table of benchmarks/quantization.py (`--learned`): kept as an entry point for old commands.

Run: `.venv/bin/python benchmarks/learned_quantization.py [--zoo] [--only NAME] [--seconds 60]`.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]

from benchmarks.quantization import main

if __name__ == "__main__":
    main(["--learned", *sys.argv[1:]])
