"""The latency estimator: it recovers a device's per-node cost and rates, and maps fused kernels to their operators."""
from __future__ import annotations

import pytest

from kiln.reports.estimate import (
    MIN_FACTOR,
    PRIOR_FACTOR,
    estimate_ms,
    estimate_range,
    fit_rates,
    leave_one_out_misses,
    median_abs_error,
)

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


def test_measurements_without_an_operator_profile_still_teach_the_device_as_whole_models():
    """A runtime that names its own kernels (OpenVINO's Convolution, LiteRT's CONV_2D) gives no per-operator point; each
    such measurement is one whole-model point, and a model of a kind never measured there still gets an estimate."""
    measured = [synthetic({"Conv": 2, "Relu": 2}, {"Conv": 1e5, "Relu": 2e3}), synthetic({"MatMul": 4, "Add": 3}, {"MatMul": 5e5, "Add": 1e3}),
                synthetic({"Gemm": 1, "Softmax": 1, "Relu": 1}, {"Gemm": 2e4, "Softmax": 100, "Relu": 100})]
    for row in measured:
        row["profile_by_op_type"] = [{"op_type": "CONV_2D", "time_ms": row["p50_ms"], "count": 1}]
    rates = fit_rates(measured)
    assert rates.points == 3
    new = synthetic({"Conv": 5, "Sigmoid": 5}, {"Conv": 3e6, "Sigmoid": 5e4})
    estimate, _ = estimate_ms(new["op_work"], new["op_histogram"], rates)
    assert estimate == pytest.approx(new["p50_ms"], rel=1e-6)


def test_the_range_is_the_worst_leave_one_out_miss_and_a_prior_with_one_model():
    exact = [dict(synthetic({"Conv": 2, "Relu": 2}, {"Conv": 1e5, "Relu": 2e3}), model_sha256="a"),
             dict(synthetic({"MatMul": 4, "Add": 3}, {"MatMul": 5e5, "Add": 1e3}), model_sha256="b"),
             dict(synthetic({"Gemm": 1, "Softmax": 1, "Relu": 1}, {"Gemm": 2e4, "Softmax": 100, "Relu": 100}), model_sha256="c")]
    new = synthetic({"Conv": 5, "Sigmoid": 5}, {"Conv": 3e6, "Sigmoid": 5e4})
    # A device that follows the cost model exactly: every model is predicted from the others; the floor is the range.
    ranged = estimate_range(new["op_work"], new["op_histogram"], exact)
    assert ranged["factor"] == MIN_FACTOR and ranged["checked_models"] == 3
    assert ranged["low_ms"] < new["p50_ms"] < ranged["high_ms"]
    # One model ran twice as slow as the cost model says: the range widens to what predicting it from the others missed.
    slow = [*exact[:2], {**exact[2], "p50_ms": exact[2]["p50_ms"] * 2,
                         "profile_by_op_type": [{**op, "time_ms": op["time_ms"] * 2} for op in exact[2]["profile_by_op_type"]]}]
    predicted, _ = estimate_ms(slow[2]["op_work"], slow[2]["op_histogram"], fit_rates(slow[:2]))
    worst = max(leave_one_out_misses(slow))
    assert worst >= slow[2]["p50_ms"] / predicted - 1e-9
    ranged = estimate_range(new["op_work"], new["op_histogram"], slow)
    assert ranged["factor"] == pytest.approx(worst) and ranged["high_ms"] / ranged["p50_ms"] == pytest.approx(worst)
    # One model: nothing to check against, the prior factor either way.
    alone = estimate_range(new["op_work"], new["op_histogram"], exact[:1])
    assert alone["factor"] == PRIOR_FACTOR and alone["checked_models"] == 0
    assert alone["low_ms"] == pytest.approx(alone["p50_ms"] / PRIOR_FACTOR)
