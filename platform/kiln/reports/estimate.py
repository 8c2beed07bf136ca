"""Latency before measuring, from per-operator timings already measured on a device. Pure.

Each profiled operator type of each measured FP32 model is one data point: its time (scaled so the
operators add up to the measured p50), its node count and its work (workers.cost: MACs for Conv,
ConvTranspose, MatMul and Gemm, output elements otherwise). On one device and backend, Kiln fits

    time = per_node_ms * nodes + per_work_ms[class] * work,    class = "mac" or "other",

by non-negative least squares on the relative error, so that a fixed cost per operator (which
dominates small models) and a throughput (which dominates large ones) are both learned. A new
model's estimate is that sum over its operator types. Fused kernels are counted as the operator
they replace (FusedConv as Conv, SkipLayerNormalization as LayerNormalization, ...).

A measurement without a per-operator profile in ONNX's names (a runtime that names its own kernels,
or none) still teaches the same three unknowns as one whole-model point: its p50 against its node
count and its work of each class. So a new kind of model gets an estimate on any device that has
measured another model.

The estimate comes with its uncertainty, from the device's own record: each model measured there is
predicted from the others only (leave one out), and the range is the estimate times and divided by
the worst of those misses (at least MIN_FACTOR). With one model there is nothing to check against,
so the range is PRIOR_FACTOR either way, the worst miss of benchmarks/latency_estimate.py's zoo.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from statistics import median

import numpy as np

from workers.cost import MAC_OPS

# Kernels of ONNX Runtime's fusions, named by the ONNX operator whose work they do.
KERNEL_OPS = {"FusedConv": "Conv", "FusedGemm": "Gemm", "FusedMatMul": "MatMul", "SkipLayerNormalization": "LayerNormalization",
              "BiasGelu": "Erf", "FastGelu": "Erf", "QuickGelu": "Erf", "NhwcConv": "Conv"}
CLASSES = ("mac", "other")
# The range of an estimate: at least this factor either way; a factor of PRIOR_FACTOR when only one model was measured
# (benchmarks/latency_estimate.py's worst leave-one-out misses on its zoo: -63% and +64%, about 2.7x).
MIN_FACTOR = 1.25
PRIOR_FACTOR = 3.0


def op_class(op_type: str) -> str:
    return "mac" if op_type in MAC_OPS else "other"


@dataclass
class Rates:
    """One device and backend: milliseconds per node and per unit of work of each class."""

    per_node_ms: float = 0.0
    per_work_ms: dict[str, float] = field(default_factory=dict)
    op_types: set[str] = field(default_factory=set)
    points: int = 0
    models: int = 0


def _op_times(profile_by_op_type: list[dict], p50_ms: float) -> dict[str, float]:
    times: dict[str, float] = {}
    for row in profile_by_op_type or []:
        op = KERNEL_OPS.get(row.get("op_type"), row.get("op_type"))
        if op:
            times[op] = times.get(op, 0.0) + float(row.get("time_ms") or 0.0)
    total = sum(times.values())
    return {op: time * p50_ms / total for op, time in times.items()} if total > 0 else {}


def _op_points(row: dict) -> list[tuple[str, float, dict[str, float], float]]:
    """(op type, nodes, work per class, time) of each profiled operator type of one measurement."""
    work, counts = row.get("op_work") or {}, row.get("op_histogram") or {}
    points = []
    for op, time in _op_times(row.get("profile_by_op_type") or [], row.get("p50_ms") or 0.0).items():
        if time > 0 and work.get(op) and counts.get(op):
            points.append((op, float(counts[op]), {op_class(op): float(work[op])}, time))
    return points


def _model_point(row: dict) -> tuple[None, float, dict[str, float], float] | None:
    """The whole model as one point (its p50 against all its nodes and work), for a measurement with no usable profile."""
    work, counts, time = row.get("op_work") or {}, row.get("op_histogram") or {}, float(row.get("p50_ms") or 0.0)
    if time <= 0 or not work:
        return None
    by_class: dict[str, float] = {}
    for op, amount in work.items():
        by_class[op_class(op)] = by_class.get(op_class(op), 0.0) + float(amount)
    return None, float(sum(counts.values())), by_class, time


def _points(measurements: list[dict]) -> tuple[list[tuple], set[str]]:
    """Every point the fit learns from, and the operator types the device is known to have run."""
    points, op_types = [], set()
    for row in measurements:
        per_op = _op_points(row)
        if per_op:
            points += per_op
            op_types |= {op for op, *_ in per_op}
        elif (whole := _model_point(row)) is not None:
            points.append(whole)
            op_types |= {op for op, amount in (row.get("op_work") or {}).items() if amount}
    return points, op_types


def _nnls(matrix: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients, by trying every subset (there are three unknowns)."""
    best, best_residual = np.zeros(matrix.shape[1]), float(np.sum(target**2))
    for size in range(1, matrix.shape[1] + 1):
        for columns in itertools.combinations(range(matrix.shape[1]), size):
            solution, *_ = np.linalg.lstsq(matrix[:, columns], target, rcond=None)
            if np.all(solution >= 0):
                residual = float(np.sum((matrix[:, columns] @ solution - target) ** 2))
                if residual < best_residual:
                    best, best_residual = np.zeros(matrix.shape[1]), residual
                    best[list(columns)] = solution
    return best


def fit_rates(measurements: list[dict]) -> Rates:
    """Rates of one device and backend from its FP32 measurements (dicts: p50_ms, op_work, op_histogram, profile_by_op_type)."""
    points, op_types = _points(measurements)
    if not points:
        return Rates(models=len(measurements))
    # Each point divided by its own time: the fit minimises relative errors, so tiny operators count too.
    matrix = np.array([[count / time] + [work.get(name, 0.0) / time for name in CLASSES] for _op, count, work, time in points])
    coefficients = _nnls(matrix, np.ones(len(points)))
    return Rates(per_node_ms=float(coefficients[0]), per_work_ms=dict(zip(CLASSES, map(float, coefficients[1:]))),
                 op_types=op_types, points=len(points), models=len(measurements))


def estimate_ms(work: dict[str, float], counts: dict[str, int], rates: Rates) -> tuple[float | None, float]:
    """(estimated p50 in ms, share of the work whose operator type was measured on the device); None without rates."""
    total = sum(work.values())
    if total <= 0 or not rates.points:
        return None, 0.0
    estimate = sum(rates.per_node_ms * counts.get(op, 0) + amount * rates.per_work_ms.get(op_class(op), 0.0) for op, amount in work.items())
    covered = sum(amount for op, amount in work.items() if op in rates.op_types)
    return estimate, covered / total


def _model_key(row: dict) -> str:
    return str(row.get("model_sha256") or id(row))


def leave_one_out_misses(measurements: list[dict]) -> list[float]:
    """Per model measured on the device (its first row), how far off its estimate from the other models alone was, as a
    factor >= 1 (2.0: half or twice the measured p50). Empty with fewer than two models."""
    firsts: dict[str, dict] = {}
    for row in measurements:
        firsts.setdefault(_model_key(row), row)
    if len(firsts) < 2:
        return []
    misses = []
    for key, row in firsts.items():
        others = [other for other in measurements if _model_key(other) != key]
        estimate, _ = estimate_ms(row.get("op_work") or {}, row.get("op_histogram") or {}, fit_rates(others))
        measured = float(row.get("p50_ms") or 0.0)
        if estimate and measured > 0:
            misses.append(max(estimate / measured, measured / estimate))
    return misses


def estimate_range(work: dict[str, float], counts: dict[str, int], measurements: list[dict]) -> dict | None:
    """The estimated p50 of a model with this work from a device's FP32 measurements of other models, with its range
    (see the module docstring); None when nothing measured there can be fitted."""
    rates = fit_rates(measurements)
    p50_ms, coverage = estimate_ms(work, counts, rates)
    if p50_ms is None:
        return None
    misses = leave_one_out_misses(measurements)
    factor = max(MIN_FACTOR, *misses) if misses else PRIOR_FACTOR
    return {"p50_ms": p50_ms, "low_ms": p50_ms / factor, "high_ms": p50_ms * factor, "factor": factor, "checked_models": len(misses),
            "coverage": coverage}


def relative_error(estimated: float, measured: float) -> float:
    return (estimated - measured) / measured


def median_abs_error(pairs: list[tuple[float, float]]) -> float:
    return median(abs(relative_error(e, m)) for e, m in pairs)
