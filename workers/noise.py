"""Whether one variant is faster than another beyond the noise its measurements showed. Pure.

The one decision function is `latency_ratio(fast, slow)`: it takes the timing samples of two
variants and returns the ratio of their p50s with an interval. Samples come, best first, from
interleaved re-timing (`interleaved_medians_ms`: per-round medians, rounds paired across variants,
so that drift hits both sides alike), else from the benchmark's windows (`window_medians_ms`: the
medians of three contiguous chunks of one run), else only from the per-run spread (cv and count).

The interval language is fixed (`compare`): an interval wholly above 1.0 is "faster", wholly below
is "slower", and only an interval that contains 1.0 is a "tie".
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from devices.paired import RESOLUTION, ratio_interval

# Two-sided 95% normal quantile; the sampling error of a median is about 1.2533 times that of a mean.
Z_95 = 1.96
MEDIAN_EFFICIENCY = 1.2533
INTERLEAVED = "interleaved re-timing"
WINDOWS = "benchmark windows"
RUN_SPREAD = "per-run spread"
UNKNOWN = "p50 only"
FASTER, SLOWER, TIE = "faster", "slower", "tie"


def compare(low: float, high: float) -> str:
    """The interval language: [low, high] wholly above 1.0 is "faster", wholly below "slower", else a "tie"."""
    if low > 1.0:
        return FASTER
    if high < 1.0:
        return SLOWER
    return TIE


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
    rounds: int | None = None
    per_round: tuple[float, ...] = field(default=())

    @property
    def comparison(self) -> str:
        """"faster", "slower" or "tie": what `fast` is against `slow` (`compare`)."""
        return compare(self.low, self.high)

    @property
    def beyond_noise(self) -> bool:
        """`fast` is faster even at the low end of the interval."""
        return self.comparison == FASTER

    def as_dict(self) -> dict:
        return {"ratio": self.ratio, "low": self.low, "high": self.high, "source": self.source, "comparison": self.comparison,
                "beyond_noise": self.beyond_noise, "rounds": self.rounds}


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


def latency_ratio(fast: Timing, slow: Timing) -> LatencyRatio:
    """How much faster `fast` is than `slow`, and whether beyond the noise of both measurements."""
    ratio = slow.p50 / fast.p50
    if len(fast.interleaved) >= 3 and len(fast.interleaved) == len(slow.interleaved):
        # The point is the ratio of the p50s a table shows (each the median of its round medians), so a reader can check
        # it by dividing; the interval is the paired one, which is what decides faster, slower or tie.
        paired = [s / f for s, f in zip(slow.interleaved, fast.interleaved) if f > 0]
        _, low, high = ratio_interval(paired)
        return LatencyRatio(ratio, low, high, INTERLEAVED, rounds=len(paired), per_round=tuple(paired))
    # Independent runs: their relative errors add in quadrature, symmetric on a log scale, and what timing cannot resolve on top.
    combined = math.hypot(fast.relative_noise(), slow.relative_noise()) + math.log1p(RESOLUTION)
    source = WINDOWS if WINDOWS in (fast.source(), slow.source()) else fast.source() if fast.source() != UNKNOWN else slow.source()
    return LatencyRatio(ratio, ratio * math.exp(-combined), ratio * math.exp(combined), source)
