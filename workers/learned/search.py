"""When `auto` proposes learned variants (learned rounding and QAT): only for a calibrated INT8 family that is faster than the best
variant within tolerance yet misses it. Learning cannot make a variant faster, so a family that is
already slower than the best passing variant is never worth the training time; and only the
fastest such family is learned, since each costs a training budget on the worker.
"""
from __future__ import annotations

import math
from typing import Any

LEARNED_METHODS = ("adaround", "qat")
SEARCH_LEARN_SECONDS = 120


def learned_proposals(*, sweep: list[dict[str, Any]], measured: list[dict[str, Any]], best_passing: float) -> list[dict[str, Any]]:
    """Learned rounding and QAT on the fastest calibrated ONNX Runtime INT8 family that missed the tolerance (QAT is
    skipped at build time, with the reason, when the graph cannot run in PyTorch)."""
    templates = {spec["key"]: spec for spec in sweep if _learnable(spec)}
    fastest: dict[str, float] = {}
    for entry in measured:
        key, p50, accuracy = entry.get("key"), (entry.get("latency_ms") or {}).get("p50"), entry.get("accuracy") or {}
        if key not in templates or p50 is None or accuracy.get("value") is None:
            continue
        if accuracy.get("within_tolerance"):
            fastest[key] = -math.inf  # some backend already meets the tolerance with this family: nothing to learn
        elif fastest.get(key, math.inf) != -math.inf:
            fastest[key] = min(fastest.get(key, math.inf), p50)
    candidates = sorted((p50, key) for key, p50 in fastest.items() if p50 != -math.inf and p50 < best_passing)
    if not candidates:
        return []
    template = templates[candidates[0][1]]
    return [{"key": f"{template['key']}-{method}", "precision": "int8", "backends": template["backends"],
             "options": {**template["options"], "learn": method, "learn_seconds": SEARCH_LEARN_SECONDS}} for method in LEARNED_METHODS]


def _learnable(spec: dict[str, Any]) -> bool:
    options = spec.get("options") or {}
    return spec.get("precision") == "int8" and options.get("tool", "onnxruntime") == "onnxruntime" and not options.get("nodes_to_exclude")
