"""The latency ratio with its interval: which samples it reads and when a speed-up is beyond noise."""
from __future__ import annotations

import pytest

from workers.noise import (
    FASTER,
    INTERLEAVED,
    RUN_SPREAD,
    SLOWER,
    TIE,
    UNKNOWN,
    WINDOWS,
    Timing,
    compare,
    interval_text,
    latency_ratio,
    ratio_text,
    timing_of,
)


@pytest.mark.parametrize(("low", "high", "said"), [
    (1.02, 1.30, FASTER),   # wholly above 1.0
    (0.68, 0.99, SLOWER),   # wholly below: the "0.95x (0.68x to 0.99x) ... a tie" is slower
    (0.97, 1.12, TIE),      # contains 1.0
    (0.50, 2.00, TIE),      # a wide interval containing 1.0 is still a tie, not "too noisy to tell"
    (1.00, 1.20, TIE),      # touching 1.0 is containing it
    (0.80, 1.00, TIE),
])
def test_the_interval_language_is_faster_above_slower_below_and_tie_only_across_one(low, high, said):
    assert compare(low, high) == said


def test_a_ratio_says_its_comparison_and_a_slower_interval_is_not_a_tie():
    slower = latency_ratio(Timing(p50=1.0, windows=(1.0, 1.0, 1.0)), Timing(p50=0.95, windows=(0.95, 0.95, 0.95)))
    assert slower.comparison == SLOWER and not slower.beyond_noise and slower.as_dict()["comparison"] == SLOWER
    assert "too_noisy" not in slower.as_dict()


def test_steady_windows_make_a_ten_percent_speed_up_real():
    fast = Timing(p50=0.90, windows=(0.90, 0.905, 0.895))
    slow = Timing(p50=1.00, windows=(1.00, 1.005, 0.995))
    ratio = latency_ratio(fast, slow)
    assert ratio.source == WINDOWS
    assert ratio.ratio == pytest.approx(1 / 0.9)
    assert 1.0 < ratio.low < ratio.ratio < ratio.high
    assert ratio.beyond_noise


def test_windows_that_disagree_make_the_same_speed_up_a_tie():
    # The small CNN: 0.021 vs 0.023 ms, the faster one's windows 20% apart.
    fast = Timing(p50=0.021, windows=(0.019, 0.021, 0.025))
    slow = Timing(p50=0.023, windows=(0.023, 0.0232, 0.0228))
    ratio = latency_ratio(fast, slow)
    assert ratio.ratio == pytest.approx(0.023 / 0.021)
    assert ratio.low < 1.0 < ratio.high
    assert not ratio.beyond_noise


def test_the_per_run_spread_bounds_the_median_when_there_are_no_windows():
    few_noisy = latency_ratio(Timing(p50=0.9, cv=0.5, count=20), Timing(p50=1.0, cv=0.5, count=20))
    many_steady = latency_ratio(Timing(p50=0.9, cv=0.05, count=2000), Timing(p50=1.0, cv=0.05, count=2000))
    assert few_noisy.source == many_steady.source == RUN_SPREAD
    assert not few_noisy.beyond_noise and many_steady.beyond_noise


def test_interleaved_rounds_are_paired_so_shared_drift_cancels():
    # Both variants drift together from 1x to 3x; per round the slow one is always 1.2x the fast.
    drift = [1.0, 1.5, 2.0, 2.5, 3.0, 2.0, 1.0]
    fast = Timing(p50=2.0, interleaved=tuple(drift), windows=(1.0, 2.0, 3.0))
    slow = Timing(p50=2.4, interleaved=tuple(1.2 * d for d in drift), windows=(1.2, 2.4, 3.6))
    ratio = latency_ratio(fast, slow)
    assert ratio.source == INTERLEAVED and ratio.rounds == 7 and ratio.per_round == pytest.approx([1.2] * 7)
    # The point is the paired estimate (the median of the per-round ratios), inside the paired interval that decides.
    # The interval is widened by what timing cannot resolve (kiln_contract.paired.RESOLUTION), here around an exact 1.2.
    assert ratio.ratio == pytest.approx(1.2) and ratio.low == pytest.approx(1.2 / 1.02) and ratio.comparison == FASTER
    # Read as unpaired windows, the same drift would swamp the difference.
    assert not latency_ratio(Timing(p50=1.8, windows=(1.0, 2.0, 3.0)), Timing(p50=2.0, windows=(1.2, 2.4, 3.6))).beyond_noise


def test_interleaved_ratios_that_straddle_one_are_a_tie():
    fast = Timing(p50=1.0, interleaved=(1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0))
    slow = Timing(p50=1.05, interleaved=(1.10, 0.95, 1.08, 0.97, 1.12, 0.99, 1.06, 1.04))
    ratio = latency_ratio(fast, slow)
    assert ratio.low < 1.0 < ratio.high and not ratio.beyond_noise


def test_a_p50_alone_has_no_noise_and_the_entry_reader_finds_the_samples():
    assert latency_ratio(Timing(p50=0.99), Timing(p50=1.0)).source == UNKNOWN
    entry = {"latency_ms": {"p50": 2.0, "cv": 0.1, "count": 50}, "timing": {"window_medians_ms": [1.9, 2.0, 2.1], "interleaved_medians_ms": [2.0, 2.1, 1.9]}}
    timing = timing_of(entry)
    assert timing.windows == (1.9, 2.0, 2.1) and timing.interleaved == (2.0, 2.1, 1.9) and timing.cv == 0.1
    assert timing_of({"latency_ms": None}) is None


def test_an_interval_prints_the_digits_that_decide_it():
    assert interval_text(1.0019, 1.0512) == "1.002x to 1.05x"  # faster: its low end is above 1, and says so
    assert interval_text(0.9996, 1.0512) == "0.9996x to 1.05x"  # a tie: its low end is below 1
    assert interval_text(1.0, 1.2) == "1.00x to 1.20x" and ratio_text(2.0) == "2.00x" and ratio_text(0.95) == "0.95x"


def _entry(key, precision, p50, windows, drop):
    return {"id": f"{key}@onnxruntime", "key": key, "precision": precision, "backend": "onnxruntime", "compile": {},
            "latency_ms": {"p50": p50}, "timing": {"window_medians_ms": list(windows)}, "size_bytes": 1000,
            "accuracy": {"metric": "cosine", "value": 1.0 - drop, "drop": drop, "within_tolerance": True}}


@pytest.mark.parametrize("int8_windows, said", [
    ((9.73, 9.75, 9.765), FASTER),  # the case: a low end of 1.0019, "1.00x" once rounded
    ((9.5, 9.75, 9.9), TIE),        # the same p50 with windows that drift 4%
])
def test_fp32_at_10_ms_and_int8_at_9_75_ms_get_one_verdict_everywhere(int8_windows, said):
    """Issue 36: the decision said "Use int8 … 1.03x faster (1.00x to 1.05x)" while the search note on the same page said "INT8
    does not pay on this device: 1.03x … within noise", and a regression used a third rule. All three now ask latency_ratio."""
    from kiln.reports.regressions import compare as regression
    from workers.quantize.verdicts import family_verdicts
    from workers.scoring import decide

    fp32, int8 = _entry("fp32", "fp32", 10.0, (10.0, 10.0, 10.0), 0.0), _entry("int8-minmax", "int8", 9.75, int8_windows, 0.0001)
    ratio = latency_ratio(timing_of(int8), timing_of(fp32))
    assert ratio.comparison == said and ratio.low <= ratio.ratio <= ratio.high
    decision = decide([fp32, int8], {"metric": "cosine", "max_drop": 0.01})
    note = family_verdicts([fp32, int8])["int8"]
    slower_again = regression(measured=timing_of(fp32), baseline=timing_of(int8))
    interval = interval_text(ratio.low, ratio.high)
    if said == FASTER:
        assert interval.startswith("1.002x to ")
        assert decision["variant"] == int8["id"] and decision["comparison"] == FASTER
        assert f"1.03x faster than FP32 on onnxruntime ({interval})" in decision["text"]
        assert note["paying_backends"] == ["onnxruntime"] and note["reason"].startswith("INT8 pays on onnxruntime: up to 1.03x")
        assert slower_again["flagged"]
    else:
        assert interval.startswith("0.9") and "1.00x" not in interval
        assert decision["variant"] == fp32["id"] and decision["tie"] and f"1.03x faster ({interval}), a tie" in decision["text"]
        assert note["paying_backends"] == [] and note["reason"].startswith("INT8 does not pay on this device: 1.03x")
        assert not slower_again["flagged"]
