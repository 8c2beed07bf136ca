"""Paired, interleaved timing: per-round ratios, their 95% interval, and when the leader has separated. Pure.

Finalists are timed in rotated rounds (`devices.bench.interleaved_window_medians`), every finalist
once per round, so what disturbs the device in one round hits all of them alike and cancels in the
per-round ratios. The agent stops adding rounds once `settled` says so; the server's verdict
(workers/noise.py) reads the same ratios with the same interval, so the two never disagree.

Kiln's one rule for "beyond noise" starts here: its confidence level (CONFIDENCE), its resolution (RESOLUTION) and its
interval language (`compare`) live in this module because the agent stops its rounds by them and imports nothing of
the server; workers/noise.py `latency_ratio` applies them to every comparison the product makes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

CONFIDENCE = 0.95
# The fewest rounds whose extreme ratios already bound the median at 95% (2 / 2**6 < 5%).
MIN_ROUNDS = 6
# What timing cannot resolve however many rounds it takes: two copies of one build, timed side by side, differ by
# up to this much (code placement, the order within a round). Every ratio interval is widened by it, so a gap this
# small is a tie, not "faster", and a decision does not flip on it from one run to the next.
RESOLUTION = 0.02
# A rival whose whole (widened) interval lies within this of 1.0 is a settled tie: more rounds would not separate it.
TIE_BAND = 0.04
FASTER, SLOWER, TIE = "faster", "slower", "tie"
# Why a device's side-by-side rounds stopped: `stop_reason`'s answers, and "time" where the agent stopped them after the
# seconds the server allowed while other jobs waited for the device.
STOP_REASONS = ("separated", "tie settled", "cap", "time")


def compare(low: float, high: float) -> str:
    """The interval language: [low, high] wholly above 1.0 is "faster", wholly below "slower", else a "tie"."""
    if low > 1.0:
        return FASTER
    if high < 1.0:
        return SLOWER
    return TIE


def median(values: list[float]) -> float:
    ordered = sorted(values)
    count = len(ordered)
    if count == 0:
        raise ValueError("no values")
    return ordered[count // 2] if count % 2 else (ordered[count // 2 - 1] + ordered[count // 2]) / 2


def median_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """Median of `values` and a distribution-free interval for it (order statistics of the binomial).

    The widest-inward symmetric pair of ranks whose coverage is still at least `confidence`; with too
    few values for that, the extremes (whose coverage is then below `confidence`).
    """
    ordered = sorted(values)
    count = len(ordered)
    lower_rank = 0
    for rank in range(count // 2):
        outside = 2 * sum(math.comb(count, k) for k in range(rank + 1)) / 2**count
        if outside > 1.0 - confidence:
            break
        lower_rank = rank
    return median(ordered), ordered[lower_rank], ordered[count - 1 - lower_rank]


def ratio_interval(ratios: list[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """The median of per-round ratios and its interval, widened by RESOLUTION on both sides."""
    middle, low, high = median_interval(ratios, confidence)
    return middle, low / (1.0 + RESOLUTION), high * (1.0 + RESOLUTION)


def paired_ratios(fast: list[float], slow: list[float]) -> list[float]:
    """Per round, how much faster `fast` was than `slow` (slow / fast); rounds where `fast` read 0 are dropped."""
    return [s / f for f, s in zip(fast, slow) if f > 0]


@dataclass(frozen=True)
class Separation:
    """Where a set of finalists stands after some rounds: the leader, and each rival's interval against it."""

    leader: int
    rounds: int
    rivals: dict[int, tuple[float, float, float]]  # index -> (median ratio, low, high): rival time / leader time

    @property
    def separated(self) -> bool:
        """The leader is faster than every rival at `CONFIDENCE` (each interval wholly above 1.0)."""
        return all(compare(low, high) == FASTER for _, low, high in self.rivals.values())

    @property
    def settled(self) -> bool:
        """Every rival is either beaten or a tie within TIE_BAND: more rounds would not change the verdict."""
        return all(compare(low, high) == FASTER or (low >= 1.0 - TIE_BAND and high <= 1.0 + TIE_BAND) for _, low, high in self.rivals.values())


def separation(round_medians: list[list[float]]) -> Separation:
    """The leader (lowest median of its round medians) and each rival's per-round ratio interval against it."""
    if not round_medians or any(len(values) != len(round_medians[0]) for values in round_medians):
        raise ValueError("every finalist needs the same number of rounds")
    leader = min(range(len(round_medians)), key=lambda index: (median(round_medians[index]), index))
    rivals = {index: ratio_interval(paired_ratios(round_medians[leader], values))
              for index, values in enumerate(round_medians) if index != leader}
    return Separation(leader=leader, rounds=len(round_medians[0]), rivals=rivals)


def stop_reason(round_medians: list[list[float]], *, min_rounds: int = MIN_ROUNDS, max_rounds: int) -> str | None:
    """Why the rounds may stop now ("separated", "tie settled", "cap"), or None to time another round."""
    rounds = len(round_medians[0]) if round_medians else 0
    if rounds >= max_rounds:
        return "cap"
    if rounds < min_rounds:
        return None
    state = separation(round_medians)
    if state.separated:
        return "separated"
    if state.settled:
        return "tie settled"
    return None


def out_of_time(elapsed_s: float, max_seconds: float | None, *, rounds: int, min_rounds: int = MIN_ROUNDS) -> str | None:
    """"time" once the rounds have run `max_seconds` and their minimum is done, else None (no limit: None). The agent
    stops by it while other jobs wait for the device; the benchmarks' local search at the end of its time budget."""
    if max_seconds is None or rounds < min_rounds:
        return None
    return "time" if elapsed_s >= max_seconds else None
