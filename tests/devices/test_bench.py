import math

import numpy as np
import pytest

from devices import bench
from devices.backends import get_backend
from devices.bench import BenchmarkInterrupted, BenchmarkSettings, detect_instability, summarize_latencies


def test_summarize_latencies_matches_hand_computed_values():
    summary = summarize_latencies([3.0, 1.0, 5.0, 2.0, 4.0])
    assert summary["p50"] == pytest.approx(3.0)
    assert summary["p90"] == pytest.approx(4.6)  # rank 0.9 * 4 = 3.6 → 4 + 0.6 * (5 - 4)
    assert summary["p99"] == pytest.approx(4.96)
    assert summary["mean"] == pytest.approx(3.0)
    assert summary["std"] == pytest.approx(math.sqrt(2.0))  # population: (4+1+0+1+4)/5 = 2
    assert summary["cv"] == pytest.approx(math.sqrt(2.0) / 3.0)
    assert (summary["min"], summary["max"], summary["count"]) == (1.0, 5.0, 5)


def test_summarize_latencies_of_one_sample_has_zero_spread():
    summary = summarize_latencies([2.5])
    assert summary["p50"] == summary["p99"] == 2.5
    assert summary["std"] == 0.0 and summary["cv"] == 0.0


def test_summarize_latencies_rejects_no_samples():
    with pytest.raises(ValueError):
        summarize_latencies([])


def test_steady_windows_are_stable():
    assert not detect_instability([10.0] * 10 + [10.5] * 10 + [10.2] * 10)


def test_windows_disagreeing_by_more_than_ten_percent_are_unstable():
    # medians 10, 10, 12: the largest is 20% above the smallest
    assert detect_instability([10.0] * 10 + [10.0] * 10 + [12.0] * 10)


def test_exactly_ten_percent_is_not_more_than_ten_percent():
    assert not detect_instability([10.0] * 5 + [11.0] * 5 + [10.0] * 5)


def test_instability_looks_at_three_consecutive_windows_only():
    # a slow 20% drift over five windows: each three neighbours differ by at most 10%
    drifting = [10.0] * 4 + [10.5] * 4 + [11.0] * 4 + [11.5] * 4 + [12.0] * 4
    assert not detect_instability(drifting, windows=5)
    jump = [10.0] * 16 + [12.0] * 4
    assert detect_instability(jump, windows=5)


def test_instability_uses_window_medians_not_outliers():
    samples = [10.0] * 9 + [100.0] + [10.0] * 10 + [10.0] * 9 + [100.0]
    assert not detect_instability(samples)


def test_too_few_samples_cannot_be_judged():
    assert not detect_instability([1.0, 5.0])


def test_time_runs_stops_at_min_runs_when_min_seconds_is_reached():
    calls = []
    samples = bench.time_runs(lambda: calls.append(1), min_runs=5, min_seconds=0.0)
    assert len(samples) == len(calls) == 5
    assert all(isinstance(sample, int) and sample >= 0 for sample in samples)


def test_time_runs_keeps_going_until_min_seconds():
    import time

    started = time.perf_counter()
    samples = bench.time_runs(lambda: None, min_runs=1, min_seconds=0.05)
    assert time.perf_counter() - started >= 0.05
    assert len(samples) > 1


def test_time_runs_can_be_stopped():
    with pytest.raises(BenchmarkInterrupted):
        bench.time_runs(lambda: None, min_runs=10**9, min_seconds=100.0, should_stop=lambda: True)


def test_measure_warms_up_before_timing():
    calls = []
    settings = BenchmarkSettings(warmup_runs=3, warmup_seconds=0.0, min_runs=4, min_seconds=0.0)
    result = bench.measure(lambda: calls.append(1), settings)
    assert len(calls) == 7
    assert result["latency_ms"]["count"] == 4


def test_settings_from_task_object():
    settings = BenchmarkSettings.from_dict(
        {"warmup_runs": 1, "warmup_seconds": 0.5, "min_runs": 7, "min_seconds": 2, "batch_sizes": [1, 8]}
    )
    assert settings == BenchmarkSettings(1, 0.5, 7, 2.0, [1, 8])
    assert BenchmarkSettings.from_dict(None) == BenchmarkSettings()


def test_run_benchmark_reports_the_protocol_fields(tiny_model_path, tmp_path):
    compiled = get_backend("onnxruntime").compile(tiny_model_path, tmp_path, threads=1)
    feeds = {
        size: {"input": np.zeros((size, 1, 8, 8), dtype=np.float32)} for size in (1, 4)
    }
    settings = BenchmarkSettings(warmup_runs=2, warmup_seconds=0.0, min_runs=9, min_seconds=0.0)
    result = bench.run_benchmark(compiled, feeds, settings, load_ms=12.5)
    assert set(result["latency_ms"]) >= {"p50", "p90", "p99", "mean", "std", "cv"}
    assert result["batch_size"] == 1 and result["runs"] == 9
    assert [row["batch_size"] for row in result["by_batch"]] == [1, 4]
    batch4 = result["by_batch"][1]
    assert batch4["throughput_per_s"] == pytest.approx(4 * 1000.0 / batch4["latency_ms"]["mean"])
    assert result["load_ms"] == 12.5
    assert result["first_inference_ms"] > 0
    assert result["peak_memory_mb"] > 0
    assert result["threads"] == 1
    assert isinstance(result["unstable"], bool)


def test_interleaved_windows_alternate_the_runs_round_by_round_and_report_each_window():
    from devices.bench import interleaved_window_medians

    order: list[str] = []
    runs = [lambda name=name: order.append(name) for name in "ABC"]
    rounds_done: list[int] = []
    settings = BenchmarkSettings(warmup_runs=1, warmup_seconds=0.0, min_runs=2, min_seconds=0.0)
    medians = interleaved_window_medians(runs, settings, 3, after_round=rounds_done.append)
    assert [len(values) for values in medians] == [3, 3, 3]
    assert rounds_done == [1, 2, 3]
    # Each window warms up and times one run before the next run's window starts; each round starts
    # one run later, so no run holds a fixed place in the rounds.
    windows = [order[i] for i in range(0, len(order), 3)]
    assert windows == list("ABCBCACAB"), order
