"""Latency before measuring, from per-operator timings already measured on a device. Pure.

Each profiled operator type of each measured FP32 model is one data point: its time (scaled so the
operators add up to the measured p50), its node count and its work (workers.cost: MACs for Conv,
ConvTranspose, MatMul and Gemm, output elements otherwise). On one device and backend, Kiln fits

    time = per_node_ms * nodes + per_work_ms[class] * work,    class = "mac" or "other",

by non-negative least squares on the relative error, so that a fixed cost per operator (which
dominates small models) and a throughput (which dominates large ones) are both learned. A new
model's estimate is that sum over its operator types. Fused kernels are counted as the operator
they replace (FusedConv as Conv, SkipLayerNormalization as LayerNormalization, ...).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from statistics import median

import numpy as np

MAC_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
# Kernels of ONNX Runtime's fusions, named by the ONNX operator whose work they do.
KERNEL_OPS = {"FusedConv": "Conv", "FusedGemm": "Gemm", "FusedMatMul": "MatMul", "SkipLayerNormalization": "LayerNormalization",
              "BiasGelu": "Erf", "FastGelu": "Erf", "QuickGelu": "Erf", "NhwcConv": "Conv"}
CLASSES = ("mac", "other")


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


def _points(measurements: list[dict]) -> list[tuple[str, float, float, float]]:
    points = []
    for row in measurements:
        work, counts = row.get("op_work") or {}, row.get("op_histogram") or {}
        for op, time in _op_times(row.get("profile_by_op_type") or [], row.get("p50_ms") or 0.0).items():
            if time > 0 and work.get(op) and counts.get(op):
                points.append((op, float(counts[op]), float(work[op]), time))
    return points


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
    points = _points(measurements)
    if not points:
        return Rates(models=len(measurements))
    # Each point divided by its own time: the fit minimises relative errors, so tiny operators count too.
    matrix = np.array([[count / time] + [work / time if op_class(op) == name else 0.0 for name in CLASSES] for op, count, work, time in points])
    coefficients = _nnls(matrix, np.ones(len(points)))
    return Rates(per_node_ms=float(coefficients[0]), per_work_ms=dict(zip(CLASSES, map(float, coefficients[1:]))),
                 op_types={op for op, *_ in points}, points=len(points), models=len(measurements))


def estimate_ms(work: dict[str, float], counts: dict[str, int], rates: Rates) -> tuple[float | None, float]:
    """(estimated p50 in ms, share of the work whose operator type was measured on the device); None without rates."""
    total = sum(work.values())
    if total <= 0 or not rates.points:
        return None, 0.0
    estimate = sum(rates.per_node_ms * counts.get(op, 0) + amount * rates.per_work_ms.get(op_class(op), 0.0) for op, amount in work.items())
    covered = sum(amount for op, amount in work.items() if op in rates.op_types)
    return estimate, covered / total


def relative_error(estimated: float, measured: float) -> float:
    return (estimated - measured) / measured


def median_abs_error(pairs: list[tuple[float, float]]) -> float:
    return median(abs(relative_error(e, m)) for e, m in pairs)
