"""Operator support before compiling: each runtime's own answer to "which of this model's operators do you run?".

Every backend answers through `Backend.operator_support(model_path)` from its runtime (ONNX Runtime's node
placement, OpenVINO's `core.query_model` and reader, a LiteRT converter's report), in one shape:

    {"backend": "openvino", "runtime": "OpenVINO", "version": "2026.4.1", "device": "CPU",
     "verdict": "runs" | "partial" | "cannot_run" | "unknown",
     "reason": "OpenVINO 2026.4.1 cannot read the model: …" | None,
     "source": "core.read_model + core.query_model",
     "native": {"Conv": 3, …}, "fallback": {…}, "unsupported": {…},   # operator type -> node count
     "nodes": {"fallback": [node names], "unsupported": [node names]}}  # at most MAX_NODES each

`runs`: every operator runs natively; `partial`: some fall back (to another device or execution provider) and
none is refused; `cannot_run`: the runtime refuses the model or an operator in it; `unknown`: the runtime gave no
answer (an older version without the API). A backend whose verdict is `cannot_run` is skipped by a job, with the
reason, before anything is built for it.

`python -m devices.support model.onnx` prints what this machine's runtimes say.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from devices.backends.base import Backend
from devices.backends.registry import available_backends

RUNS, PARTIAL, CANNOT_RUN, UNKNOWN = "runs", "partial", "cannot_run", "unknown"
VERDICTS = (RUNS, PARTIAL, CANNOT_RUN, UNKNOWN)
MAX_NODES = 50
MAX_REASON_CHARS = 1500
CONTROL_FLOW = ("Loop", "Scan", "If")


def answer(*, backend: str, runtime: str, version: str | None, device: str, source: str,
           native: Iterable[tuple[str, str]] = (), fallback: Iterable[tuple[str, str]] = (),
           unsupported: Iterable[tuple[str, str]] = (), reason: str | None = None, refused: bool = False) -> dict:
    """One backend's answer from (node name, operator type) pairs; `refused` when the runtime would not take the model at all."""
    native, fallback, unsupported = list(native), list(fallback), list(unsupported)
    if refused or unsupported:
        verdict = CANNOT_RUN
    elif fallback:
        verdict = PARTIAL
    elif native:
        verdict = RUNS
    else:
        verdict = UNKNOWN
    return {
        "backend": backend, "runtime": runtime, "version": version, "device": device, "source": source,
        "verdict": verdict, "reason": (reason or "")[:MAX_REASON_CHARS] or None,
        "native": _counts(native), "fallback": _counts(fallback), "unsupported": _counts(unsupported),
        "nodes": {"fallback": [name for name, _ in fallback][:MAX_NODES], "unsupported": [name for name, _ in unsupported][:MAX_NODES]},
    }


def _counts(nodes: list[tuple[str, str]]) -> dict[str, int]:
    return dict(Counter(op_type for _, op_type in nodes).most_common())


def unknown(*, backend: str, runtime: str, version: str | None, device: str, reason: str) -> dict:
    """The answer of a runtime that cannot say (no API for it in this version)."""
    return answer(backend=backend, runtime=runtime, version=version, device=device, source="none", reason=reason)


def runnable(report: dict) -> bool:
    """Whether a job may build and measure this backend (every verdict but `cannot_run`)."""
    return report.get("verdict") != CANNOT_RUN


def summary(report: dict) -> str:
    """One line for a job's event log: "OpenVINO 2026.4.1: 12 operators native, 1 falls back (Softmax)"."""
    name = f"{report.get('runtime') or report.get('backend')} {report.get('version') or ''}".strip()
    if report.get("verdict") == CANNOT_RUN:
        return report.get("reason") or f"{name} cannot run this model"
    if report.get("verdict") == UNKNOWN:
        return f"{name}: no operator-support answer ({report.get('reason') or 'not reported'})"
    parts = [f"{sum(report['native'].values())} operator(s) native"]
    if report["fallback"]:
        parts.append(f"{sum(report['fallback'].values())} fall back ({', '.join(report['fallback'])})")
    return f"{name}: {', '.join(parts)}"


def first_lines(message: str) -> str:
    """A runtime's exception text without its source locations ("Exception from src/…", "Check 'false' failed at …")."""
    kept = [line.strip(" -") for line in str(message).splitlines()
            if line.strip() and not re.match(r"^(Exception from |Check '.*' failed at |\[ ?(ERROR|WARN)|Summary:)", line.strip())]
    return " ".join(kept)[:MAX_REASON_CHARS]


def containers(model_path: Path, op_types: set[str], message: str = "") -> list[str]:
    """The top-level nodes (a Loop, If or Scan) whose subgraphs hold any of `op_types`, as "Loop 'decoder'"; when a
    runtime's message names no operation but speaks of a loop (a scan, an if), the model's nodes of that kind."""
    import onnx

    def inner_types(graph) -> set[str]:
        found = set()
        for node in graph.node:
            found.add(node.op_type)
            for attribute in node.attribute:
                for subgraph in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs):
                    found |= inner_types(subgraph)
        return found

    try:
        graph = onnx.load(str(model_path), load_external_data=False).graph
    except Exception:
        return []
    named = []
    spoken_of = {kind for kind in CONTROL_FLOW if re.search(rf"\b{kind}", message, re.IGNORECASE)}
    for node in graph.node:
        subgraphs = [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
        subgraphs += [g for a in node.attribute for g in a.graphs]
        holds = subgraphs and set().union(*(inner_types(g) for g in subgraphs)) & op_types
        if holds or (subgraphs and not op_types and node.op_type in spoken_of):
            named.append(f"{node.op_type} {(node.name or node.output[0])!r}")
    return named


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
