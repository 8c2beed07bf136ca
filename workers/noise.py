"""Whether one variant is faster than another beyond the noise its measurements showed. Pure.

The one decision function is `latency_ratio(fast, slow)`: it takes the timing samples of two
variants and returns the ratio of their p50s with an interval. Samples come, best first, from
interleaved re-timing (`interleaved_medians_ms`: per-round medians, rounds paired across variants,
so that drift hits both sides alike), else from the benchmark's windows (`window_medians_ms`: the
medians of three contiguous chunks of one run), else only from the per-run spread (cv and count).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

# Two-sided 95% normal quantile; the sampling error of a median is about 1.2533 times that of a mean.
Z_95 = 1.96
MEDIAN_EFFICIENCY = 1.2533
INTERLEAVED = "interleaved re-timing"
WINDOWS = "benchmark windows"
RUN_SPREAD = "per-run spread"
UNKNOWN = "p50 only"
# An interval wider than this (high / low) settles nothing: such a gap is "too noisy to tell", not a tie.
MAX_DECIDABLE_SPREAD = 1.5


@dataclass(frozen=True)
class Timing:
    """What a variant's benchmark says about its latency: p50, and the samples to judge its noise by."""

    p50: float
    interleaved: tuple[float, ...] = ()
    windows: tuple[float, ...] = ()
    cv: float | None = None
    count: int | None = None

    def relative_noise(self) -> float:
        """How far this p50 may be off, as a fraction of it: the range of its window medians (drift
        within the run), or the median's 95% sampling error from the per-run spread, whichever is larger."""
        if self.p50 <= 0:
            return 0.0
        window_range = (max(self.windows) - min(self.windows)) / self.p50 if len(self.windows) >= 2 else 0.0
        sampling = Z_95 * MEDIAN_EFFICIENCY * self.cv / math.sqrt(self.count) if self.cv and self.count else 0.0
        return max(window_range, sampling)

    def source(self) -> str:
        if len(self.windows) >= 2:
            return WINDOWS
        return RUN_SPREAD if self.cv and self.count else UNKNOWN


@dataclass(frozen=True)
class LatencyRatio:
    """`ratio` = slow p50 / fast p50 (above 1: `fast` is faster), with a 95% interval [`low`, `high`]."""

    ratio: float
    low: float
    high: float
    source: str
    samples: dict = field(default_factory=dict)

    @property
    def beyond_noise(self) -> bool:
        """`fast` is faster even at the low end of the interval."""
        return self.low > 1.0

    @property
    def too_noisy(self) -> bool:
        """The interval is too wide (high / low above MAX_DECIDABLE_SPREAD) to call what it holds a tie."""
        return self.low <= 0 or self.high / self.low > MAX_DECIDABLE_SPREAD

    def as_dict(self) -> dict:
        return {"ratio": self.ratio, "low": self.low, "high": self.high, "source": self.source, "beyond_noise": self.beyond_noise,
                "too_noisy": self.too_noisy}


def timing_of(entry: dict) -> Timing | None:
    """The timing samples of one report entry (see `_entry` in selectors); None when it has no p50."""
    latency = entry.get("latency_ms") or {}
    if not latency.get("p50"):
        return None
    timing = entry.get("timing") or {}
    return Timing(
        p50=float(latency["p50"]),
        interleaved=tuple(float(v) for v in timing.get("interleaved_medians_ms") or ()),
        windows=tuple(float(v) for v in timing.get("window_medians_ms") or ()),
        cv=latency.get("cv"),
        count=latency.get("count"),
    )


def _median_interval(values: list[float]) -> tuple[float, float, float]:
    """Median of `values` and a distribution-free ~95% interval for it (order statistics of the binomial)."""
    ordered = sorted(values)
    count = len(ordered)
    median = ordered[count // 2] if count % 2 else (ordered[count // 2 - 1] + ordered[count // 2]) / 2
    # The widest symmetric pair of ranks whose coverage is at least 95%; with five or fewer samples, the extremes.
    lower_rank = 0
    for rank in range(count // 2):
        outside = 2 * sum(math.comb(count, k) for k in range(rank + 1)) / 2**count
        if outside > 0.05:
            break
        lower_rank = rank
    return median, ordered[lower_rank], ordered[count - 1 - lower_rank]


def latency_ratio(fast: Timing, slow: Timing) -> LatencyRatio:
    """How much faster `fast` is than `slow`, and whether beyond the noise of both measurements."""
    ratio = slow.p50 / fast.p50
    if len(fast.interleaved) >= 3 and len(fast.interleaved) == len(slow.interleaved):
        paired = [s / f for s, f in zip(slow.interleaved, fast.interleaved) if f > 0]
        median, low, high = _median_interval(paired)
        return LatencyRatio(median, low, high, INTERLEAVED)
    # Independent runs: their relative errors add in quadrature, symmetric on a log scale.
    combined = math.hypot(fast.relative_noise(), slow.relative_noise())
    source = WINDOWS if WINDOWS in (fast.source(), slow.source()) else fast.source() if fast.source() != UNKNOWN else slow.source()
    return LatencyRatio(ratio, ratio * math.exp(-combined), ratio * math.exp(combined), source)
