"""A re-measured variant is a regression when it is slower beyond the noise of both runs, by Kiln's one rule (workers/noise.py).

These pinned the old rule (two sigma of the noisier run, and at least 5%); issue 36 made every "slower" one comparison.
"""
from kiln.reports.regressions import compare, measurement_timing
from workers.noise import Timing, latency_ratio


def _timing(p50, std, runs=50, windows=()):
    return measurement_timing(latency_ms={"p50": p50, "std": std, "cv": std / p50, "count": runs, "window_medians_ms": list(windows)}, p50_ms=p50)


def test_slower_beyond_noise_is_flagged_with_its_interval():
    verdict = compare(measured=_timing(1.3, 0.02), baseline=_timing(1.0, 0.03))
    assert verdict["flagged"] and abs(verdict["slowdown"] - 1.3) < 1e-9
    assert 1.0 < verdict["low"] < 1.3 < verdict["high"] and verdict["text"].startswith("1.30x slower (")


def test_windows_that_drift_apart_make_the_same_slowdown_noise():
    drifting = _timing(1.3, 0.02, windows=(1.0, 1.3, 1.7))
    assert not compare(measured=drifting, baseline=_timing(1.0, 0.01))["flagged"]


def test_the_regression_rule_is_the_decisions_rule():
    # Whatever the decision would call "faster" (the baseline against the new run) is a regression, and nothing else.
    for new_p50 in (1.01, 1.02, 1.03, 1.05, 1.1):
        new, old = _timing(new_p50, 0.01, runs=200), _timing(1.0, 0.01, runs=200)
        assert compare(measured=new, baseline=old)["flagged"] == latency_ratio(old, new).beyond_noise


def test_a_drift_within_what_timing_resolves_is_not_flagged():
    # A steady benchmark 1.5% slower: within the 2% that two copies of one build differ by when timed side by side.
    assert not compare(measured=_timing(1.015, 0.0001, runs=5000), baseline=_timing(1.0, 0.0001, runs=5000))["flagged"]


def test_faster_is_never_a_regression():
    assert not compare(measured=Timing(p50=0.5), baseline=Timing(p50=1.0))["flagged"]


def test_a_row_stored_before_latency_summaries_is_read_from_its_p50_std_and_runs():
    timing = measurement_timing(latency_ms={}, p50_ms=2.0, std_ms=0.2, runs=40)
    assert timing.cv == 0.1 and timing.count == 40 and timing.windows == ()
