"""Slower beyond the measured noise, and by at least 5%, is a regression; anything less is not."""
from kiln.reports.regressions import compare


def test_slower_beyond_noise_is_flagged():
    verdict = compare(p50_ms=1.3, std_ms=0.02, baseline_p50_ms=1.0, baseline_std_ms=0.03)
    assert verdict["flagged"] and abs(verdict["slowdown"] - 1.3) < 1e-9 and abs(verdict["noise_ms"] - 0.06) < 1e-9


def test_within_the_noisier_runs_spread_is_not():
    assert not compare(p50_ms=1.3, std_ms=0.2, baseline_p50_ms=1.0, baseline_std_ms=0.01)["flagged"]


def test_a_steady_benchmark_does_not_flag_small_drifts():
    assert not compare(p50_ms=1.03, std_ms=0.001, baseline_p50_ms=1.0, baseline_std_ms=0.001)["flagged"]


def test_faster_is_never_a_regression():
    assert not compare(p50_ms=0.5, std_ms=0.0, baseline_p50_ms=1.0, baseline_std_ms=0.0)["flagged"]
