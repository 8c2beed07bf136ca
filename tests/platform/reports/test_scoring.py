"""Report scoring: the Pareto set, the recommendation with its reason, and FP32's noise figure."""
from __future__ import annotations

from kiln.reports.scoring import fp32_noise, pareto_ids, recommend, score_accuracy

TOLERANCE = {"metric": "auto", "max_drop": 0.01}


def measured(value, figure="top1_agreement", reference=None):
    return {"outputs": {"y": {"kind": "class_scores", "primary": True, "primary_metric": figure, "metrics": {figure: value},
                              "reference": {figure: reference} if reference is not None else {}, "errors": {}}}}


def entry(id, precision, p50, value, backend="onnxruntime"):
    return {"id": id, "precision": precision, "backend": backend, "latency_ms": {"p50": p50}, "accuracy": score_accuracy(TOLERANCE, measured(value))}


def test_pareto_set_drops_dominated_variants():
    entries = [entry(1, "fp32", 2.0, 1.0), entry(2, "int8", 1.0, 0.995), entry(3, "fp16", 2.5, 0.999)]
    assert pareto_ids(entries) == {1, 2}


def test_pareto_and_fallback_rank_lower_is_better_figures_by_their_drop():
    tolerance = {"metric": "relative_l2", "max_drop": 0.01}
    close = {"id": 1, "precision": "int8", "backend": "x", "latency_ms": {"p50": 2.0}, "accuracy": score_accuracy(tolerance, measured(0.02, "relative_l2"))}
    far = {"id": 2, "precision": "int4-weight", "backend": "x", "latency_ms": {"p50": 1.0}, "accuracy": score_accuracy(tolerance, measured(0.5, "relative_l2"))}
    assert pareto_ids([close, far]) == {1, 2}
    chosen, reason = recommend([close, far], tolerance)
    assert chosen == 1 and reason.startswith("No variant met the tolerance")


def test_recommends_the_fastest_within_tolerance_not_the_fastest_overall():
    entries = [entry(1, "fp32", 2.0, 1.0), entry(2, "int8", 1.0, 0.95), entry(3, "int8-dynamic", 1.5, 0.995)]
    chosen, reason = recommend(entries, TOLERANCE)
    assert chosen == 3
    assert "int8-dynamic" in reason and "1.33x" in reason


def test_slow_int8_is_never_recommended_and_the_reason_says_so():
    entries = [entry(1, "fp32", 1.0, 1.0), entry(2, "int8", 1.6, 0.999)]
    chosen, reason = recommend(entries, TOLERANCE)
    assert chosen == 1
    assert "int8 does not pay" in reason


def test_when_nothing_meets_the_tolerance_the_most_accurate_is_returned_with_why():
    entries = [entry(1, "int8", 1.0, 0.90), entry(2, "int4-weight", 0.8, 0.80)]
    chosen, reason = recommend(entries, TOLERANCE)
    assert chosen == 1
    assert reason.startswith("No variant met the tolerance")


def test_nothing_measured_says_so():
    chosen, reason = recommend([{"id": 1, "precision": "fp32", "backend": "x", "latency_ms": None, "accuracy": {"value": None}}], TOLERANCE)
    assert chosen is None and "No variant was measured" in reason


def test_fp32_noise_lists_what_fp32_scores_per_backend():
    entries = [entry(1, "fp32", 1.0, 1.0, "openvino"), entry(2, "fp32", 1.0, 0.9995), entry(3, "int8", 0.5, 0.99)]
    noise = fp32_noise(entries)
    assert [row["backend"] for row in noise] == ["onnxruntime", "openvino"]
    assert abs(noise[0]["drop"] - 0.0005) < 1e-12 and noise[1]["drop"] == 0.0
