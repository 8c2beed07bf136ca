"""The benchmark protocol of DESIGN.md section 6: warm-up, timed runs, statistics.

The statistics (`summarize_latencies`, `detect_instability`) are pure functions of the samples;
the timing loop (`time_runs`) does nothing between two clock reads but call the runtime.
"""

from __future__ import annotations

import logging
import os
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

NS_PER_MS = 1_000_000


class BenchmarkInterrupted(Exception):
    """`should_stop` answered True during a benchmark."""


@dataclass
class BenchmarkSettings:
    """How long to warm up and measure; the task's `benchmark` object."""

    warmup_runs: int = 10
    warmup_seconds: float = 1.0
    min_runs: int = 50
    min_seconds: float = 3.0
    batch_sizes: list[int] = field(default_factory=lambda: [1])

    @classmethod
    def from_dict(cls, data: dict | None) -> BenchmarkSettings:
        data = data or {}
        defaults = cls()
        return cls(
            warmup_runs=int(data.get("warmup_runs", defaults.warmup_runs)),
            warmup_seconds=float(data.get("warmup_seconds", defaults.warmup_seconds)),
            min_runs=max(1, int(data.get("min_runs", defaults.min_runs))),
            min_seconds=float(data.get("min_seconds", defaults.min_seconds)),
            batch_sizes=[int(size) for size in data.get("batch_sizes") or defaults.batch_sizes],
        )


# The windows of interleaved re-timing, where contenders are timed side by side in round-robin
# windows: the host search's final confirmation and the server's RETIME task (sent to the agent as
# its `window`) both use these. Short windows: many rounds of all contenders beat a few long runs of each.
INTERLEAVED_WINDOW = {"warmup_runs": 3, "warmup_seconds": 0.05, "min_runs": 10, "min_seconds": 0.25}


# ---------------------------------------------------------------------------------------------
# Statistics


def summarize_latencies(samples_ms) -> dict:
    """p50/p90/p99 (linear interpolation between closest ranks, numpy's default), mean,
    population standard deviation, coefficient of variation (std / mean), min, max and count."""
    samples = np.asarray(samples_ms, dtype=np.float64)
    if samples.size == 0:
        raise ValueError("no latency samples")
    mean = float(samples.mean())
    std = float(samples.std())
    p50, p90, p99 = (float(value) for value in np.percentile(samples, [50, 90, 99]))
    return {
        "p50": p50,
        "p90": p90,
        "p99": p99,
        "mean": mean,
        "std": std,
        "cv": std / mean if mean > 0 else 0.0,
        "min": float(samples.min()),
        "max": float(samples.max()),
        "count": int(samples.size),
    }


def window_medians(samples_ms, windows: int = 3) -> list[float]:
    """Medians of `windows` contiguous, near-equal chunks of the samples, in run order."""
    samples = np.asarray(samples_ms, dtype=np.float64)
    return [float(np.median(chunk)) for chunk in np.array_split(samples, windows) if chunk.size]


def detect_instability(samples_ms, windows: int = 3, threshold: float = 0.10) -> bool:
    """Whether some three consecutive windows of the run disagree: split the samples (in run
    order) into `windows` chunks and flag when, for any three neighbouring chunks, the largest
    median exceeds the smallest by more than `threshold` (relative to the smallest). Fewer samples
    than windows cannot be judged and count as stable."""
    if windows < 1:
        raise ValueError("windows must be at least 1")
    if len(samples_ms) < windows:
        return False
    medians = window_medians(samples_ms, windows)
    span = min(3, len(medians))
    for start in range(len(medians) - span + 1):
        group = medians[start : start + span]
        low, high = min(group), max(group)
        if low <= 0.0:
            if high > 0.0:
                return True
            continue
        if (high - low) / low > threshold:
            return True
    return False


# ---------------------------------------------------------------------------------------------
# Timing


def time_runs(
    run: Callable[[], Any],
    *,
    min_runs: int,
    min_seconds: float,
    should_stop: Callable[[], bool] | None = None,
) -> list[int]:
    """Call `run` at least `min_runs` times and for at least `min_seconds`; return each call's
    wall time in nanoseconds. Only `run()` lies between the two clock reads of a sample."""
    clock = time.perf_counter_ns
    samples: list[int] = []
    append = samples.append
    min_ns = int(min_seconds * 1e9)
    count = 0
    started = clock()
    while True:
        before = clock()
        run()
        after = clock()
        append(after - before)
        count += 1
        if count >= min_runs and after - started >= min_ns:
            return samples
        if should_stop is not None and should_stop():
            raise BenchmarkInterrupted("benchmark stopped")


def measure(
    run: Callable[[], Any],
    settings: BenchmarkSettings,
    *,
    should_stop: Callable[[], bool] | None = None,
    windows: int = 3,
    threshold: float = 0.10,
) -> dict:
    """Warm up, time, and summarize one bound inference; latencies in ms."""
    time_runs(
        run,
        min_runs=settings.warmup_runs,
        min_seconds=settings.warmup_seconds,
        should_stop=should_stop,
    )
    samples_ns = time_runs(
        run, min_runs=settings.min_runs, min_seconds=settings.min_seconds, should_stop=should_stop
    )
    samples_ms = np.asarray(samples_ns, dtype=np.float64) / NS_PER_MS
    return {
        "latency_ms": summarize_latencies(samples_ms),
        "unstable": detect_instability(samples_ms, windows=windows, threshold=threshold),
        "window_medians_ms": window_medians(samples_ms, windows),
        "samples_ms": samples_ms,
    }


def rotated_order(count: int, shift: int) -> list[int]:
    """0..count-1 started at `shift` (mod count): the order of one interleaved round."""
    start = shift % count if count else 0
    return [*range(start, count), *range(start)]


def interleaved_window_medians(
    runs: list[Callable[[], Any]],
    settings: BenchmarkSettings,
    rounds: int,
    *,
    should_stop: Callable[[], bool] | None = None,
    after_round: Callable[[int], None] | None = None,
) -> list[list[float]]:
    """Time several bound inferences side by side: `rounds` round-robin windows, the median of each.

    Window i of every run falls in the same stretch of time, so load that drifts over the rounds
    hits every run alike and cancels in the per-window ratios (the report pairs them). Each round
    starts one run later (A B C, B C A, C A B, …) so no run always comes first or last in a round
    (a fixed place biased two copies of one build by 16% on a loaded machine).
    `after_round(done)` is called after each round (the agent reports progress, which keeps its lease).
    """
    medians: list[list[float]] = [[] for _ in runs]
    for done in range(1, rounds + 1):
        for index, value in enumerate(interleaved_round(runs, settings, shift=done - 1, should_stop=should_stop)):
            medians[index].append(value)
        if after_round is not None:
            after_round(done)
    return medians


def interleaved_round(runs: list[Callable[[], Any]], settings: BenchmarkSettings, *, shift: int,
                      should_stop: Callable[[], bool] | None = None) -> list[float]:
    """One round: every run timed once, in the order `rotated_order(len(runs), shift)`; each run's median, in run order."""
    return [float(np.median(samples)) for samples in interleaved_round_samples(runs, settings, shift=shift, should_stop=should_stop)]


def interleaved_round_samples(runs: list[Callable[[], Any]], settings: BenchmarkSettings, *, shift: int,
                              should_stop: Callable[[], bool] | None = None) -> list[np.ndarray]:
    """One round as `interleaved_round` times it, with every run's samples (ms) rather than only their median: a re-timed
    row's figures (p90, p99, min, max, throughput) then come from the same rounds as its median."""
    samples: list[np.ndarray] = [np.empty(0)] * len(runs)
    for index in rotated_order(len(runs), shift):
        samples[index] = measure(runs[index], settings, should_stop=should_stop)["samples_ms"]
    return samples


def side_by_side_row(samples: list[np.ndarray], *, batch_size: int) -> dict:
    """What one re-timed variant's rounds say, as one measurement set: the latency summary of all their samples and the
    throughput it implies (`{"latency_ms", "throughput_per_s", "batch_size"}`)."""
    latency = summarize_latencies(np.concatenate(samples))
    return {"latency_ms": latency, "throughput_per_s": batch_size * 1000.0 / latency["mean"] if latency["mean"] else None,
            "batch_size": batch_size}


# ---------------------------------------------------------------------------------------------
# Memory


def reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark of this process (Linux ≥ 4.0); False if unsupported,
    in which case peaks include everything the process did before."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    """The RSS high-water mark of this process in MB."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is in kilobytes on Linux and in bytes on macOS.
    return peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0


def current_rss_mb() -> float:
    import psutil

    return psutil.Process(os.getpid()).memory_info().rss / (1024.0 * 1024.0)


# ---------------------------------------------------------------------------------------------
# The whole protocol on a compiled model


def run_benchmark(
    compiled,
    feeds_by_batch: dict[int, dict[str, np.ndarray]],
    settings: BenchmarkSettings,
    *,
    load_ms: float | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> dict:
    """Benchmark a `CompiledModel` at each batch size in `feeds_by_batch` (in order); the first
    batch size is the headline. Returns the `metrics` object of a task result."""
    if not feeds_by_batch:
        raise ValueError("nothing to benchmark: no feeds")
    batch_sizes = list(feeds_by_batch)
    first_run = compiled.bind(feeds_by_batch[batch_sizes[0]])
    before = time.perf_counter_ns()
    first_run()
    first_inference_ms = (time.perf_counter_ns() - before) / NS_PER_MS

    by_batch = []
    for batch_size in batch_sizes:
        result = measure(compiled.bind(feeds_by_batch[batch_size]), settings, should_stop=should_stop)
        latency = result["latency_ms"]
        by_batch.append(
            {
                "batch_size": batch_size,
                "latency_ms": latency,
                "throughput_per_s": batch_size * 1000.0 / latency["mean"] if latency["mean"] else None,
                "runs": latency["count"],
                "unstable": result["unstable"],
                "window_medians_ms": result["window_medians_ms"],
            }
        )
        logger.info(
            "batch %d: p50 %.3f ms, p90 %.3f ms, cv %.3f over %d runs%s",
            batch_size, latency["p50"], latency["p90"], latency["cv"], latency["count"],
            " (unstable)" if result["unstable"] else "",
        )
    headline = by_batch[0]
    return {
        "latency_ms": headline["latency_ms"],
        "throughput_per_s": headline["throughput_per_s"],
        "batch_size": headline["batch_size"],
        "runs": headline["runs"],
        "unstable": any(row["unstable"] for row in by_batch),
        "by_batch": by_batch,
        "load_ms": load_ms,
        "first_inference_ms": first_inference_ms,
        "peak_memory_mb": peak_rss_mb(),
        "threads": compiled.threads,
        "settings": asdict(settings),
    }
