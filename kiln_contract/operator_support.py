"""An operator-support answer: what one runtime says about a model's operators, in one shape for every runtime.

Every backend answers through `Backend.operator_support(model_path)` from its runtime (ONNX Runtime's node
placement, OpenVINO's `core.query_model` and reader, a LiteRT converter's report), in this shape:

    {"backend": "openvino", "runtime": "OpenVINO", "version": "2026.4.1", "device": "CPU",
     "verdict": "runs" | "partial" | "cannot_run" | "unknown",
     "reason": "OpenVINO 2026.4.1 cannot read the model: …" | None,
     "source": "core.read_model + core.query_model",
     "native": {"Conv": 3, …}, "fallback": {…}, "unsupported": {…},   # operator type -> node count
     "nodes": {"fallback": [node names], "unsupported": [node names]}}  # at most MAX_NODES each

`runs`: every operator runs natively; `partial`: some fall back (to another device or execution provider) and
none is refused; `cannot_run`: the runtime refuses the model or an operator in it; `unknown`: the runtime gave no
answer (an older version without the API). A backend whose verdict is `cannot_run` is skipped by a job, with the
reason, before anything is built for it. The agent sends this shape with a task's result, and the server reads it:
both import it from here (devices/support.py asks this machine's runtimes for it).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

RUNS, PARTIAL, CANNOT_RUN, UNKNOWN = "runs", "partial", "cannot_run", "unknown"
VERDICTS = (RUNS, PARTIAL, CANNOT_RUN, UNKNOWN)
MAX_NODES = 50
MAX_REASON_CHARS = 1500


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
