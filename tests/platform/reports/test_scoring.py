"""Report scoring: tolerance verdicts, the Pareto set and the recommendation with its reason."""
from __future__ import annotations

from kiln.reports.scoring import pareto_ids, recommend, resolve_metric, score_accuracy

TOLERANCE = {"metric": "auto", "max_drop": 0.01}


def entry(id, precision, p50, value, backend="onnxruntime", metric="top1_agreement"):
    accuracy = score_accuracy({"metric": metric, "max_drop": 0.01}, {metric: value}, metric)
    return {"id": id, "precision": precision, "backend": backend, "latency_ms": {"p50": p50}, "accuracy": accuracy}


def test_auto_metric_prefers_labels_then_agreement_then_cosine():
    assert resolve_metric(TOLERANCE, {"accuracy": 0.9, "top1_agreement": 1.0}) == "accuracy"
    assert resolve_metric(TOLERANCE, {"accuracy": None, "top1_agreement": 0.99}) == "top1_agreement"
    assert resolve_metric(TOLERANCE, {"cosine": 0.99}) == "cosine"
    assert resolve_metric({"metric": "sqnr"}, {"accuracy": 0.9}) == "sqnr"


def test_accuracy_drop_is_measured_against_the_fp32_accuracy():
    scored = score_accuracy({"metric": "accuracy", "max_drop": 0.01}, {"accuracy": 0.97, "reference_accuracy": 0.985}, "accuracy")
    assert abs(scored["drop"] - 0.015) < 1e-12 and scored["within_tolerance"] is False
    scored = score_accuracy({"metric": "accuracy", "max_drop": 0.02}, {"accuracy": 0.97, "reference_accuracy": 0.985}, "accuracy")
    assert scored["within_tolerance"] is True


def test_sqnr_uses_a_floor_in_decibels():
    assert score_accuracy({"metric": "sqnr", "min_value": 30}, {"sqnr_db": 31.0}, "sqnr")["within_tolerance"]
    assert not score_accuracy({"metric": "sqnr", "min_value": 30}, {"sqnr_db": 29.0}, "sqnr")["within_tolerance"]


def test_pareto_set_drops_dominated_variants():
    entries = [entry(1, "fp32", 2.0, 1.0), entry(2, "int8", 1.0, 0.995), entry(3, "fp16", 2.5, 0.999)]
    assert pareto_ids(entries) == {1, 2}


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
