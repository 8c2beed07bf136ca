"""Report scoring: the Pareto set, the recommendation with its reason, and FP32's noise figure."""
from __future__ import annotations

import pytest

from workers.scoring import fp32_noise, pareto_ids, recommend, recommendation, score_accuracy

TOLERANCE = {"metric": "auto", "max_drop": 0.01}


def measured(value, figure="top1_agreement", reference=None):
    return {"outputs": {"y": {"kind": "class_scores", "primary": True, "primary_metric": figure, "metrics": {figure: value},
                              "reference": {figure: reference} if reference is not None else {}, "errors": {}}}}


def entry(id, precision, p50, value, backend="onnxruntime", windows=(), unstable=False, size=1000, key=None):
    return {"id": id, "key": key or precision, "precision": precision, "backend": backend, "latency_ms": {"p50": p50},
            "accuracy": score_accuracy(TOLERANCE, measured(value)), "timing": {"window_medians_ms": list(windows)}, "unstable": unstable,
            "size_bytes": size}


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


def test_slow_int8_is_never_recommended_and_the_why_not_row_says_so():
    entries = [entry(1, "fp32", 1.0, 1.0), entry(2, "int8", 1.6, 0.999)]
    chosen = recommendation(entries, TOLERANCE)
    assert chosen.variant == 1
    assert chosen.alternatives == [{"family": "int8", "variants": 1, "variant": 2, "label": "int8 on onnxruntime", "p50_ms": 1.6,
                                    "drop": pytest.approx(0.001), "metric": "top1_agreement", "why": "slower: 0.62x the recommended's speed"}]


def test_the_verdict_is_one_line_naming_the_variant_the_speed_up_and_the_cost():
    entries = [entry(1, "fp32", 2.0, 1.0, windows=(2.0, 2.01, 1.99)), entry(2, "int8", 1.0, 0.997, windows=(1.0, 1.01, 0.99), key="int8-mse")]
    verdict = recommendation(entries, TOLERANCE).verdict
    assert verdict["text"] == "Use int8-mse on onnxruntime: 2.00x faster than FP32 (1 vs 2 ms); costs 0.003 top1_agreement (0.997)."
    assert verdict["speedup"]["beyond_noise"] and not verdict["tie"]


def test_a_speed_up_inside_the_noise_is_a_tie_and_the_more_accurate_wins():
    entries = [entry(1, "fp32", 0.023, 1.0, windows=(0.023, 0.0231, 0.0229), size=4000),
               entry(2, "int4-weight", 0.021, 0.999, windows=(0.020, 0.021, 0.0225), unstable=True, size=800)]
    chosen = recommendation(entries, TOLERANCE)
    assert chosen.variant == 1
    assert chosen.verdict["tie"] and chosen.verdict["tied_with"][0]["variant"] == 2 and not chosen.verdict["tied_with"][0]["too_noisy"]
    assert "faster, a tie within noise" in chosen.reason and "more accurate one is recommended" in chosen.reason
    assert chosen.alternatives[0]["why"].endswith("a tie within noise, and less accurate")
    note = chosen.unstable[0]
    assert note["variant"] == 2 and "0.02, 0.021, 0.0225 ms" in note["text"] and "Re-measure" in note["text"]
    assert note["spread"] == pytest.approx((0.0225 - 0.020) / 0.021)


def test_a_gap_with_a_very_wide_interval_is_too_noisy_to_tell_not_a_tie_and_the_more_accurate_still_wins():
    # The small CNN: INT4 weight-only "1.10x FP32" while its own row was unstable: 0.82x to 1.46x settles nothing.
    entries = [entry(1, "fp32", 0.023, 1.0, windows=(0.023, 0.0231, 0.0229), size=4000),
               entry(2, "int4-weight", 0.021, 0.999, windows=(0.019, 0.021, 0.025), unstable=True, size=800)]
    chosen = recommendation(entries, TOLERANCE)
    assert chosen.variant == 1
    assert chosen.verdict["tie"] and chosen.verdict["tied_with"][0]["too_noisy"]
    assert chosen.reason == ("Use fp32 on onnxruntime: the FP32 reference itself; int4-weight on onnxruntime measured 1.10x faster, "
                             "so the more accurate one is recommended, but too noisy to tell: 0.82x to 1.46x; re-run on a quieter device; "
                             "no accuracy cost (top1_agreement 1).")
    assert chosen.alternatives[0]["why"] == "less accurate, and 1.10x faster is too noisy to tell: 0.82x to 1.46x; re-run on a quieter device"


def test_a_speed_up_over_fp32_with_a_very_wide_interval_is_too_noisy_to_tell():
    entries = [entry(1, "fp32", 0.023, 1.0, windows=(0.023, 0.0231, 0.0229), size=4000),
               entry(2, "int8", 0.021, 1.0, windows=(0.019, 0.021, 0.025), size=1000)]
    chosen = recommendation(entries, TOLERANCE)
    assert chosen.variant == 2 and chosen.verdict["speedup"]["too_noisy"] and not chosen.verdict["speedup"]["beyond_noise"]
    assert chosen.reason.startswith("Use int8 on onnxruntime: 1.10x the speed of FP32, too noisy to tell: 0.82x to 1.46x; "
                                    "re-run on a quieter device; nothing within the tolerance is faster")
    assert "tie" not in chosen.reason
    assert {row["family"]: row["why"] for row in chosen.alternatives}["fp32"] == (
        "larger, and 1.10x slower is too noisy to tell: 0.82x to 1.46x; re-run on a quieter device")


def test_of_a_tie_in_speed_and_accuracy_the_smaller_wins():
    entries = [entry(1, "int8", 1.00, 1.0, windows=(0.95, 1.0, 1.05), size=4000), entry(2, "int4-weight", 0.98, 1.0, windows=(0.93, 0.98, 1.03), size=1000),
               entry(3, "fp32", 3.0, 1.0, windows=(3.0, 3.0, 3.0), size=16000)]
    chosen = recommendation(entries, TOLERANCE)
    assert chosen.variant == 2
    # The faster-measured and equally accurate int8 is not preferred over a smaller one either.
    entries[0]["latency_ms"]["p50"] = 0.97
    chosen = recommendation(entries, TOLERANCE)
    assert chosen.variant == 2 and "so the smaller one is recommended" in chosen.reason
    assert {row["family"]: row["why"] for row in chosen.alternatives}["int8"].endswith("a tie within noise, and larger")


def test_a_speed_up_beyond_the_noise_beats_the_more_accurate():
    entries = [entry(1, "fp32", 2.0, 1.0, windows=(1.95, 2.0, 2.05)), entry(2, "int8", 1.5, 0.995, windows=(1.45, 1.5, 1.55))]
    assert recommendation(entries, TOLERANCE).variant == 2


def test_why_not_groups_variants_by_family_with_one_row_each():
    entries = [entry(1, "fp32", 2.0, 1.0), entry(2, "int8", 1.0, 0.999, key="int8-minmax"), entry(3, "int8", 0.9, 0.95, key="int8-mse"),
               entry(4, "int8-dynamic", 1.4, 0.999), entry(5, "fp16", 2.1, 1.0),
               {"id": 6, "key": "int4-weight", "precision": "int4-weight", "backend": "onnxruntime", "latency_ms": None,
                "accuracy": {"value": None, "within_tolerance": False}, "status": "failed", "error": "Unsupported op MatMulNBits"}]
    chosen = recommendation(entries, TOLERANCE)
    assert chosen.variant == 2
    rows = {row["family"]: row for row in chosen.alternatives}
    assert list(rows) == ["fp16", "fp32", "int4", "int8"]
    assert rows["int8"]["variants"] == 2 and rows["int8"]["label"] == "int8-dynamic on onnxruntime"
    assert rows["int8"]["why"] == "slower: 0.71x the recommended's speed"
    assert rows["int4"]["why"] == "failed: Unsupported op MatMulNBits"


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


def interleaved(id, key, backend, rounds, compile=None, size=4000):
    """An entry re-timed in paired interleaved rounds (the search's final confirmation, or an agent's re-timing)."""
    rounds = list(rounds)
    return {"id": id, "key": key, "precision": "fp32", "backend": backend, "compile": compile or {}, "size_bytes": size,
            "latency_ms": {"p50": sorted(rounds)[len(rounds) // 2], "cv": 0.2, "count": 50},
            "accuracy": score_accuracy(TOLERANCE, measured(1.0)), "timing": {"interleaved_medians_ms": rounds}}


# Per-round load on a shared machine: the same drift hits every contender of a round.
DRIFT = [1.0, 1.6, 0.9, 1.3, 2.0, 1.1, 0.95, 1.7, 1.2]


def test_a_tuned_build_that_is_not_faster_beyond_noise_loses_to_the_runtime_defaults():
    # fp32 with static shapes measured 2% faster at the median, but its paired ratios straddle 1.0:
    # picking it would put Kiln's pick at or below the vendor default (FP32, runtime defaults) it ties with.
    noise = [1.03, 0.97, 1.05, 0.99, 1.04, 0.96, 1.02, 1.00, 0.98]
    defaults = interleaved("fp32@onnxruntime", "fp32", "onnxruntime", [16.0 * d for d in DRIFT])
    tuned = interleaved("fp32+static@onnxruntime", "fp32+static", "onnxruntime",
                        [16.0 * 0.98 * d * n for d, n in zip(DRIFT, noise)], compile={"static_shapes": {"x": [1, 3, 48, 320]}})
    assert tuned["latency_ms"]["p50"] < defaults["latency_ms"]["p50"]
    chosen = recommendation([tuned, defaults], TOLERANCE)
    assert chosen.variant == "fp32@onnxruntime"
    assert chosen.verdict["tie"] and chosen.verdict["tied_with"][0]["source"] == "interleaved re-timing"
    assert "so the simpler (runtime defaults) one is recommended" in chosen.reason


def test_a_tuned_build_faster_beyond_the_paired_noise_wins_even_when_the_unpaired_spread_is_wide():
    # 12% faster in every round; the rounds themselves swing 2x, so unpaired medians would call it a tie.
    defaults = interleaved("fp32@openvino", "fp32", "openvino", [50.0 * d for d in DRIFT])
    tuned = interleaved("fp32+static@openvino", "fp32+static", "openvino", [44.0 * d for d in DRIFT],
                        compile={"static_shapes": {"x": [1, 3, 320, 320]}})
    chosen = recommendation([defaults, tuned], TOLERANCE)
    assert chosen.variant == "fp32+static@openvino"
    assert not chosen.verdict["tie"]
