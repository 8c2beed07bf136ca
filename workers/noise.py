"""Kiln's one rule for "faster beyond noise": every faster / slower / tie / pays / regression comes from `latency_ratio`. Pure.

`latency_ratio(fast, slow)` takes the timing samples of two measurements and returns how much faster
`fast` is, with an interval at kiln_contract.paired.CONFIDENCE (95%) widened by kiln_contract.paired.RESOLUTION (2%,
what timing cannot resolve). Samples come, best first, from interleaved re-timing (`interleaved`:
per-round medians, rounds paired across variants, so that drift hits both sides alike; the ratio is then
the paired estimate, the median of the per-round ratios, and lies inside its interval), else from the
benchmark's windows (`windows`: the medians of contiguous chunks of one run), else only from the per-run
spread (cv and count).

The interval language is fixed (kiln_contract.paired `compare`): an interval wholly above 1.0 is "faster",
wholly below is "slower", and only an interval that contains 1.0 is a "tie". Its text (`interval_text`)
shows the digits that decide it: a bound that two decimals would round onto 1.00 gets more ("1.002x").
The decision (workers/scoring.py), the search's family verdicts and compile-option notes
(workers/quantize/verdicts.py), the planner (workers/quantize/search.py) and the performance database's
regressions (kiln/reports/regressions.py) all ask this function; none has a threshold of its own.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist

from kiln_contract.paired import CONFIDENCE, FASTER, RESOLUTION, SLOWER, TIE, compare, ratio_interval

__all__ = ["CONFIDENCE", "FASTER", "INTERLEAVED", "RESOLUTION", "RUN_SPREAD", "SLOWER", "TIE", "UNKNOWN", "WINDOWS", "LatencyRatio",
           "Timing", "compare", "interval_text", "latency_ratio", "ratio_text", "timing_of"]

# The two-sided normal quantile of CONFIDENCE; the sampling error of a median is about 1.2533 times that of a mean.
Z = NormalDist().inv_cdf(0.5 + CONFIDENCE / 2)
MEDIAN_EFFICIENCY = 1.2533
INTERLEAVED = "interleaved re-timing"
WINDOWS = "benchmark windows"
RUN_SPREAD = "per-run spread"
UNKNOWN = "p50 only"
# Two decimals, and up to this many where two would round a ratio onto 1.00.
MAX_DIGITS = 6


def ratio_text(value: float) -> str:
    """A ratio as "1.03x": two decimals, more where two would print a value that is not 1.0 as 1.00, because which side of
    1.0 a bound lies on is what decides faster, slower or tie ("1.002x", "0.9996x")."""
    digits = 2
    while digits < MAX_DIGITS and value != 1.0 and f"{value:.{digits}f}" == f"{1.0:.{digits}f}":
        digits += 1
    return f"{value:.{digits}f}x"


def interval_text(low: float, high: float) -> str:
    """An interval as "1.002x to 1.05x" (`ratio_text` for each bound)."""
    return f"{ratio_text(low)} to {ratio_text(high)}"


@dataclass(frozen=True)
class Timing:
    """What a measurement says about its latency: p50, and the samples to judge its noise by."""

    p50: float
    interleaved: tuple[float, ...] = ()
    windows: tuple[float, ...] = ()
    cv: float | None = None
    count: int | None = None

    def relative_noise(self) -> float:
        """How far this p50 may be off, as a fraction of it: the range of its window medians (drift
        within the run), or the median's sampling error at CONFIDENCE from the per-run spread, whichever is larger."""
        if self.p50 <= 0:
            return 0.0
        window_range = (max(self.windows) - min(self.windows)) / self.p50 if len(self.windows) >= 2 else 0.0
        sampling = Z * MEDIAN_EFFICIENCY * self.cv / math.sqrt(self.count) if self.cv and self.count else 0.0
        return max(window_range, sampling)

    def source(self) -> str:
        if len(self.windows) >= 2:
            return WINDOWS
        return RUN_SPREAD if self.cv and self.count else UNKNOWN


@dataclass(frozen=True)
class LatencyRatio:
    """How much faster `fast` is than `slow` (`ratio` above 1: faster), with its interval [`low`, `high`] at CONFIDENCE."""

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

    def text(self) -> str:
        """"1.03x (1.002x to 1.05x)": the ratio and its interval, with the digits that decide it."""
        return f"{ratio_text(self.ratio)} ({interval_text(self.low, self.high)})"

    def as_dict(self) -> dict:
        return {"ratio": self.ratio, "low": self.low, "high": self.high, "source": self.source, "comparison": self.comparison,
                "beyond_noise": self.beyond_noise, "rounds": self.rounds, "ratio_text": ratio_text(self.ratio),
                "interval_text": interval_text(self.low, self.high)}


def timing_of(entry: dict) -> Timing | None:
    """The timing samples of one report entry (see `_entry` in kiln.reports.selectors); None when it has no p50."""
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


def paired(fast: Timing, slow: Timing) -> bool:
    """Whether the two were timed in the same interleaved rounds (enough of them to bound a median)."""
    return len(fast.interleaved) >= 3 and len(fast.interleaved) == len(slow.interleaved)


def latency_ratio(fast: Timing, slow: Timing) -> LatencyRatio:
    """How much faster `fast` is than `slow`, and whether beyond the noise of both measurements."""
    if paired(fast, slow):
        # The paired estimate: the median of the per-round ratios, inside the interval that decides.
        per_round = [s / f for s, f in zip(slow.interleaved, fast.interleaved) if f > 0]
        middle, low, high = ratio_interval(per_round)
        return LatencyRatio(middle, low, high, INTERLEAVED, rounds=len(per_round), per_round=tuple(per_round))
    # Independent runs: their relative errors add in quadrature, symmetric on a log scale, and what timing cannot resolve on top.
    ratio = slow.p50 / fast.p50
    combined = math.hypot(fast.relative_noise(), slow.relative_noise()) + math.log1p(RESOLUTION)
    source = WINDOWS if WINDOWS in (fast.source(), slow.source()) else fast.source() if fast.source() != UNKNOWN else slow.source()
    return LatencyRatio(ratio, ratio * math.exp(-combined), ratio * math.exp(combined), source)
