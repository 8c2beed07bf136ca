"""Latency before measuring: per-operator rates from measured profiles, applied to a new model's work. Pure.

A measured FP32 model contributes, per operator type, its profiled time (scaled so the operators
add up to the measured p50) over its work (workers.cost). A new model's estimate on a device and
backend is the sum over its operator types of work x rate; work of an operator type never seen on
that device falls back to the device's overall rate (all time over all work), and `coverage` says
which share of the work had its own rate.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from statistics import median


@dataclass
class Rates:
    """Milliseconds per unit of work on one device and backend."""

    per_op: dict[str, float] = field(default_factory=dict)
    overall: float = 0.0
    models: int = 0


def _op_times(profile_by_op_type: list[dict], p50_ms: float) -> dict[str, float]:
    times = {row["op_type"]: float(row.get("time_ms") or 0.0) for row in profile_by_op_type or [] if row.get("op_type")}
    total = sum(times.values())
    if total <= 0:
        return {}
    scale = p50_ms / total
    return {op: time * scale for op, time in times.items()}


def fit_rates(measurements: list[dict]) -> Rates:
    """Rates from measurements of one device and backend: dicts with p50_ms, op_work, profile_by_op_type."""
    op_time: dict[str, float] = defaultdict(float)
    op_work: dict[str, float] = defaultdict(float)
    total_time = total_work = 0.0
    for row in measurements:
        work = row.get("op_work") or {}
        if not work or not row.get("p50_ms"):
            continue
        total_time += row["p50_ms"]
        total_work += sum(work.values())
        for op, time in _op_times(row.get("profile_by_op_type") or [], row["p50_ms"]).items():
            if work.get(op):
                op_time[op] += time
                op_work[op] += work[op]
    per_op = {op: op_time[op] / op_work[op] for op in op_time if op_work[op] > 0}
    return Rates(per_op=per_op, overall=total_time / total_work if total_work else 0.0, models=len(measurements))


def estimate_ms(work: dict[str, float], rates: Rates) -> tuple[float | None, float]:
    """(estimated p50 in ms, share of the work with its own operator rate); None without any rate."""
    total = sum(work.values())
    if total <= 0 or (not rates.per_op and rates.overall <= 0):
        return None, 0.0
    covered = sum(amount for op, amount in work.items() if op in rates.per_op)
    estimate = sum(amount * rates.per_op.get(op, rates.overall) for op, amount in work.items())
    return estimate, covered / total


def relative_error(estimated: float, measured: float) -> float:
    return (estimated - measured) / measured


def median_abs_error(pairs: list[tuple[float, float]]) -> float:
    return median(abs(relative_error(e, m)) for e, m in pairs)
