"""The latency estimator: it recovers a device's per-node cost and rates, and maps fused kernels to their operators."""
from __future__ import annotations

import pytest

from kiln.reports.estimate import estimate_ms, fit_rates, median_abs_error

PER_NODE, MAC_RATE, OTHER_RATE = 0.002, 1e-6, 5e-6


def synthetic(counts: dict, work: dict, kernel_names: dict | None = None) -> dict:
    """A measurement of a device that follows the model exactly."""
    times = {op: PER_NODE * counts[op] + work[op] * (MAC_RATE if op in ("Conv", "MatMul", "Gemm") else OTHER_RATE) for op in counts}
    profile = [{"op_type": (kernel_names or {}).get(op, op), "time_ms": time, "count": counts[op]} for op, time in times.items()]
    return {"p50_ms": sum(times.values()), "op_histogram": counts, "op_work": work, "profile_by_op_type": profile}


def test_the_fit_recovers_the_device_and_predicts_an_unseen_model():
    measured = [
        synthetic({"Conv": 2, "Relu": 2}, {"Conv": 1e5, "Relu": 2e3}),
        synthetic({"MatMul": 4, "Add": 3}, {"MatMul": 5e5, "Add": 1e3}, kernel_names={"MatMul": "FusedMatMul"}),
        synthetic({"Gemm": 1, "Softmax": 1, "Relu": 1}, {"Gemm": 2e4, "Softmax": 100, "Relu": 100}),
    ]
    rates = fit_rates(measured)
    assert rates.per_node_ms == pytest.approx(PER_NODE, rel=1e-6)
    assert rates.per_work_ms["mac"] == pytest.approx(MAC_RATE, rel=1e-6) and rates.per_work_ms["other"] == pytest.approx(OTHER_RATE, rel=1e-6)
    new = synthetic({"Conv": 5, "Sigmoid": 5}, {"Conv": 3e6, "Sigmoid": 5e4})
    estimate, coverage = estimate_ms(new["op_work"], new["op_histogram"], rates)
    assert estimate == pytest.approx(new["p50_ms"], rel=1e-6)
    # Sigmoid never ran on this device: its share of the work had no timing of its own.
    assert coverage == pytest.approx(3e6 / (3e6 + 5e4))
    assert median_abs_error([(estimate, new["p50_ms"])]) == pytest.approx(0, abs=1e-9)


def test_no_timings_no_estimate():
    assert estimate_ms({"Conv": 10.0}, {"Conv": 1}, fit_rates([])) == (None, 0.0)
