"""Reading a measured entry of the search (a variant timed and judged on a backend): its median latency, its accuracy,
whether it meets the tolerance. No imports from the rest of the package, so every planner can read entries."""

from __future__ import annotations

import math
from typing import Any


def entry_p50(entry: dict[str, Any]) -> float | None:
    latency = entry.get("latency_ms") or {}
    return latency.get("p50")


def entry_accuracy(entry: dict[str, Any]) -> dict[str, Any] | None:
    accuracy = entry.get("accuracy")
    if not accuracy or accuracy.get("value") is None:
        return None
    return accuracy


def entry_passes(entry: dict[str, Any]) -> bool:
    accuracy = entry_accuracy(entry)
    return bool(accuracy and accuracy.get("within_tolerance"))


def measured_on(measured: list[dict[str, Any]], key: str, backend: str) -> dict[str, Any] | None:
    return next((entry for entry in measured if entry.get("key") == key and entry.get("backend") == backend), None)


def best_passing_p50(entries: list[dict[str, Any]]) -> float:
    """The fastest median latency among the entries that meet the tolerance (inf when none does): what a candidate must
    beat to be worth building or refining."""
    return min((entry_p50(entry) for entry in entries if entry_p50(entry) is not None and entry_passes(entry)), default=math.inf)
