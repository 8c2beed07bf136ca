"""The LiteRT family: which LiteRT variants a job builds, for explicit precisions and in the `auto` search.

A LiteRT variant is built in LiteRT's own format (`workers.quantize.litert`) and runs only on agents
that offer the `litert` runtime, so it is planned only when a target has it. Its key says the
runtime (`litert-int8`); its precision is the one that runs (`int8`). Pure planning: nothing here
imports the converter.
"""

from __future__ import annotations

from typing import Any

from workers.quantize.isa_families import fp16_choice
from workers.quantize.litert import RUNTIME

KEYS = {"fp32": "litert-fp32", "fp16": "litert-fp16", "int8": "litert-int8"}


def litert_spec(precision: str) -> dict[str, Any]:
    """The spec of the LiteRT build of `precision` (fp32, fp16 or int8)."""
    return {"key": KEYS[precision], "precision": precision, "options": {"runtime": RUNTIME}, "backends": [RUNTIME], "compile": {}}


def explicit_specs(precisions: list[str], *, backends: list[str] | set[str], has_calibration: bool) -> list[dict[str, Any]]:
    """The LiteRT builds of a job's explicit precisions, when a target offers LiteRT (int8 only with calibration data)."""
    if RUNTIME not in set(backends):
        return []
    return [litert_spec(precision) for precision in precisions if precision in KEYS and (precision != "int8" or has_calibration)]


def search_proposals(state) -> list[dict[str, Any]]:
    """`auto` round 1 on targets with LiteRT: FP32, full-integer INT8 (with calibration data), and FP16 on CPUs with
    FP16 arithmetic. Later rounds add nothing here; the search tries thread counts on the fastest (compile options)."""
    if state.round_number > 1 or RUNTIME not in state.backends:
        return []
    precisions = ["fp32"]
    if state.has_calibration:
        precisions.append("int8")
    if fp16_choice(state.device_isa).proposed:
        precisions.append("fp16")
    return [litert_spec(precision) for precision in precisions]
