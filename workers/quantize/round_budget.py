"""Which of a search round's candidates fit the time the `auto` search has left, estimated from the search's own pace.

The budget used to be checked only before a round, so a round begun with little time left ran past it (MiniLM-L3,
2026-12-02: round 3's two learned OpenVINO builds took the search to 784 s of a 600 s budget). A candidate's cost is
estimated from what this search has spent so far per measurement (its builds, measurements and dispatch, on this machine
under its present load) times the backends it runs on, plus its learning budget where it learns. The cheapest
candidates are kept while the estimate fits the time left; the rest are left out, and the search says which and why.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FittedRound:
    """The candidates kept for the round, the keys left out, and the sentence that says so (None: nothing left out)."""

    kept: list[dict[str, Any]]
    left_out: list[str] = field(default_factory=list)
    note: str | None = None


def search_pace(*, elapsed_s: float, measurements: int) -> float | None:
    """Seconds the search has spent per measurement so far (None before its first measurement)."""
    return elapsed_s / measurements if measurements > 0 and elapsed_s > 0 else None


def candidate_cost(spec: dict[str, Any], pace_s: float) -> float:
    """Estimated seconds for one candidate: a measurement per backend at the search's pace, plus any learning budget."""
    backends = len(spec.get("backends") or []) or 1
    learning = float((spec.get("options") or {}).get("learn_seconds") or 0.0)
    return pace_s * backends + learning


def fit_round(specs: list[dict[str, Any]], *, round_number: int, seconds_left: float | None,
              elapsed_s: float, measurements: int) -> FittedRound:
    """The candidates of round `round_number` whose estimated costs, cheapest first, add up to at most `seconds_left`
    (in the order they came). All of them when no budget or no pace is known yet."""
    pace = search_pace(elapsed_s=elapsed_s, measurements=measurements)
    if seconds_left is None or pace is None:
        return FittedRound(kept=list(specs))
    kept_keys, spent = set(), 0.0
    for spec in sorted(specs, key=lambda spec: candidate_cost(spec, pace)):
        cost = candidate_cost(spec, pace)
        if spent + cost <= seconds_left:
            kept_keys.add(spec["key"])
            spent += cost
    kept = [spec for spec in specs if spec["key"] in kept_keys]
    left_out = [spec["key"] for spec in specs if spec["key"] not in kept_keys]
    if not left_out:
        return FittedRound(kept=kept)
    note = (f"round {round_number}: {len(left_out)} candidate(s) left out for the time budget ({max(0.0, seconds_left):.0f} s "
            f"left, about {pace:.0f} s a measurement at this search's pace, plus any learning): {', '.join(left_out)}")
    return FittedRound(kept=kept, left_out=left_out, note=note)
