"""Operator support before compiling: each runtime of this machine asked which of a model's operators it runs.

`ask` puts one backend's question (`Backend.operator_support`) and turns a backend with no way to answer, or whose
asking broke, into an `unknown` answer; `check` asks every backend this machine offers. The answers have
kiln_contract/operator_support.py's shape.

`python -m devices.support model.onnx` prints what this machine's runtimes say.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from devices.backends.base import Backend
from devices.backends.registry import available_backends
from kiln_contract.operator_support import first_lines, summary, unknown


def ask(backend: Backend, model_path: str | Path) -> dict:
    """One backend's answer; `unknown` (never an exception) when it has no way to ask or the asking itself broke, so
    that a check that could not run never rules a backend out."""
    started = time.perf_counter()
    try:
        report = backend.operator_support(Path(model_path))
    except NotImplementedError as exc:
        report = unknown(backend=backend.name, runtime=backend.name, version=backend.version(), device="", reason=str(exc))
    except Exception as exc:
        report = unknown(backend=backend.name, runtime=backend.name, version=backend.version(), device="",
                         reason=f"checking failed: {type(exc).__name__}: {first_lines(str(exc))}")
    report["seconds"] = round(time.perf_counter() - started, 3)
    return report


def check(model_path: str | Path, backend_names: Iterable[str] | None = None) -> list[dict]:
    """What each backend this machine offers (or each of `backend_names`) says about the model, in name order."""
    offered = available_backends()
    names = sorted(offered) if backend_names is None else sorted(set(backend_names))
    return [ask(offered[name], model_path) if name in offered
            else unknown(backend=name, runtime=name, version=None, device="", reason=f"{name} is not installed here") for name in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devices.support", description="Ask this machine's runtimes which operators of an ONNX model they run.")
    parser.add_argument("model", type=Path)
    parser.add_argument("--backend", action="append", dest="backends", help="only this backend (repeatable); default: every one installed")
    parser.add_argument("--json", action="store_true", help="print the answers as JSON")
    args = parser.parse_args(argv)
    answers = check(args.model, args.backends)
    if args.json:
        json.dump(answers, sys.stdout)
        sys.stdout.write("\n")
    else:
        for report in answers:
            print(f"{report['backend']:<12} {report['verdict']:<11} {summary(report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
