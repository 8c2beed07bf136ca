"""Pure scoring of measured variants: the Pareto set, the noise-aware recommendation with its verdict, FP32's noise figure.

The verdict on one variant (`score_accuracy`) is the contract's. The report (kiln.reports) and the host search
(workers.quantize.search) both recommend with it, so it lives in `workers`, below the one and beside the other."""
from __future__ import annotations

from dataclasses import dataclass, field

from devices.contract import quality, score_accuracy
from workers.noise import LatencyRatio, latency_ratio, timing_of

__all__ = ["fp32_noise", "near_ties", "pareto_ids", "quality", "recommend", "recommendation", "score_accuracy", "why_not_the_others"]


def pareto_ids(entries: list[dict]) -> set:
    """Entries not beaten on both latency (lower) and accuracy (smaller drop)."""
    measured = [e for e in entries if e.get("latency_ms") and quality(e["accuracy"]) is not None]
    front = set()
    for entry in measured:
        latency, value = entry["latency_ms"]["p50"], quality(entry["accuracy"])
        dominated = any(
            other["latency_ms"]["p50"] <= latency and quality(other["accuracy"]) >= value
            and (other["latency_ms"]["p50"] < latency or quality(other["accuracy"]) > value)
            for other in measured if other is not entry
        )
        if not dominated:
            front.add(entry["id"])
    return front


def _describe(entry: dict) -> str:
    return f"{entry.get('key') or entry['precision']} on {entry['backend']}"


def family(precision: str) -> str:
    """The precision family a variant belongs to: int8-dynamic and int8 recipes are all int8."""
    return precision.split("-")[0]


def _measured(entries: list[dict]) -> list[dict]:
    return [e for e in entries if e.get("latency_ms") and e["latency_ms"].get("p50") and quality(e["accuracy"]) is not None]


def _preference(entry: dict) -> tuple:
    """Among variants whose speeds are a tie: the more accurate first, then the smaller, then the simpler (fewer
    compile options: a tuned build that is not faster beyond noise loses to the runtime's defaults), then the faster."""
    return (-quality(entry["accuracy"]), entry.get("size_bytes") or 0, len(entry.get("compile") or {}), entry["latency_ms"]["p50"])


def _ratio(fast: dict, slow: dict) -> LatencyRatio:
    return latency_ratio(timing_of(fast), timing_of(slow))


def _fp32_baseline(measured: list[dict], chosen: dict) -> dict | None:
    fp32 = [e for e in measured if e["precision"] == "fp32"]
    return next((e for e in fp32 if e["backend"] == chosen["backend"]), fp32[0] if fp32 else None)


def _times(ratio: LatencyRatio) -> str:
    return f"{ratio.ratio:.2f}x ({ratio.low:.2f}x to {ratio.high:.2f}x)"


def _too_noisy(ratio: LatencyRatio) -> str:
    """A gap whose interval is too wide to call a tie (`LatencyRatio.too_noisy`), and what to do about it."""
    return f"too noisy to tell: {ratio.low:.2f}x to {ratio.high:.2f}x; re-run on a quieter device"


def _cost(accuracy: dict) -> str:
    drop = accuracy.get("drop")
    if drop is None:
        return f"{accuracy['metric']} {accuracy['value']:.4g}"
    if drop <= 0:
        return f"no accuracy cost ({accuracy['metric']} {accuracy['value']:.4g})"
    return f"costs {drop:.2g} {accuracy['metric']} ({accuracy['value']:.4g})"


def _verdict(chosen: dict, measured: list[dict], ties: list[tuple[dict, LatencyRatio]]) -> dict:
    """The one-line verdict on the chosen variant: what it is, how much faster than FP32, what it costs."""
    baseline = _fp32_baseline(measured, chosen)
    speedup = _ratio(chosen, baseline) if baseline is not None and baseline is not chosen else None
    accuracy = chosen["accuracy"]
    if speedup is None:
        speed = "the FP32 reference itself" if chosen["precision"] == "fp32" else "no FP32 measured to compare with"
    elif speedup.beyond_noise:
        speed = f"{speedup.ratio:.2f}x faster than FP32 ({chosen['latency_ms']['p50']:.3g} vs {baseline['latency_ms']['p50']:.3g} ms)"
    elif speedup.too_noisy:
        speed = f"{speedup.ratio:.2f}x the speed of FP32, {_too_noisy(speedup)}"
    else:
        speed = f"{_times(speedup)} the speed of FP32, a tie within noise"
    if ties:
        other, ratio = ties[0]
        more = f" and {len(ties) - 1} more" if len(ties) > 1 else ""
        recommended = f"so the {_WINS_ON[_loses_on(other, chosen)]} one is recommended"
        if ratio.too_noisy:
            speed += f"; {_describe(other)}{more} measured {ratio.ratio:.2f}x faster, {recommended}, but {_too_noisy(ratio)}"
        else:
            speed += f"; {_describe(other)}{more} measured {_times(ratio)} faster, a tie within noise, {recommended}"
    elif speedup is None or not speedup.beyond_noise:
        speed += "; nothing within the tolerance is faster beyond the measured noise"
    text = f"Use {_describe(chosen)}: {speed}; {_cost(accuracy)}."
    return {
        "variant": chosen["id"], "label": _describe(chosen), "text": text, "tie": bool(ties),
        "tied_with": [{"variant": other["id"], "label": _describe(other), **ratio.as_dict()} for other, ratio in ties],
        "speedup": {"baseline": baseline["id"], **speedup.as_dict()} if speedup else None,
        "accuracy": {"metric": accuracy.get("metric"), "value": accuracy.get("value"), "drop": accuracy.get("drop")},
    }


def _why_not(entry: dict, chosen: dict | None, tolerance: dict) -> str:
    """Why one variant is not the recommendation, in a few words."""
    if entry.get("error"):
        return f"failed: {str(entry['error'])[:160]}"
    if not entry.get("latency_ms") or quality(entry["accuracy"]) is None:
        return "not measured" if entry.get("status") in ("succeeded", "failed", "canceled") else "still measuring"
    accuracy = entry["accuracy"]
    if not accuracy.get("within_tolerance"):
        allowed = f" > allowed {tolerance['max_drop']:.2g}" if accuracy.get("drop") is not None and tolerance.get("max_drop") is not None else ""
        drop = f" drop {accuracy['drop']:.2g}{allowed}" if accuracy.get("drop") is not None else f" {accuracy.get('value')}"
        return f"outside the tolerance ({accuracy.get('metric')}{drop})"
    if chosen is None:
        return ""
    if entry["latency_ms"]["p50"] >= chosen["latency_ms"]["p50"]:
        ratio = _ratio(chosen, entry)
        if ratio.beyond_noise:
            return f"slower: {1 / ratio.ratio:.2f}x the recommended's speed"
        if ratio.too_noisy:
            return f"{_loses_on(entry, chosen)}, and {ratio.ratio:.2f}x slower is {_too_noisy(ratio)}"
        return f"a tie within noise ({_times(ratio)} slower), and {_loses_on(entry, chosen)}"
    ratio = _ratio(entry, chosen)
    if ratio.beyond_noise:
        return f"{_times(ratio)} faster, but {_loses_on(entry, chosen)} than a variant that ties with it"
    if ratio.too_noisy:
        return f"{_loses_on(entry, chosen)}, and {ratio.ratio:.2f}x faster is {_too_noisy(ratio)}"
    return f"{_times(ratio)} faster: a tie within noise, and {_loses_on(entry, chosen)}"


_WINS_ON = {"less accurate": "more accurate", "larger": "smaller", "more tuned": "simpler (runtime defaults)",
            "no better": "preferred"}


def _loses_on(entry: dict, chosen: dict) -> str:
    """What a variant that ties on speed loses on against the chosen one (see `_preference`)."""
    if quality(entry["accuracy"]) < quality(chosen["accuracy"]):
        return "less accurate"
    if (entry.get("size_bytes") or 0) > (chosen.get("size_bytes") or 0):
        return "larger"
    if len(entry.get("compile") or {}) > len(chosen.get("compile") or {}):
        return "more tuned"
    return "no better"


def why_not_the_others(entries: list[dict], chosen_id, tolerance: dict) -> list[dict]:
    """Per precision family, its best other variant and why it lost: one short row each."""
    chosen = next((e for e in entries if e["id"] == chosen_id), None)
    rows = []
    for name in sorted({family(e["precision"]) for e in entries}):
        members = [e for e in entries if family(e["precision"]) == name and e["id"] != chosen_id]
        if not members:
            continue
        # The family's best showing: measured within tolerance, then measured, then anything; fastest first.
        best = min(members, key=lambda e: (not (e.get("latency_ms") and e["accuracy"].get("within_tolerance")),
                                           not e.get("latency_ms"), (e.get("latency_ms") or {}).get("p50") or 0.0))
        rows.append({"family": name, "variants": len(members), "variant": best["id"], "label": _describe(best),
                     "p50_ms": (best.get("latency_ms") or {}).get("p50"), "drop": best["accuracy"].get("drop"),
                     "metric": best["accuracy"].get("metric"), "why": _why_not(best, chosen, tolerance)})
    return rows


def unstable_notes(entries: list[dict]) -> list[dict]:
    """Each unstable measurement in words: how far its windows disagreed, and so how far its speed is known."""
    notes = []
    for entry in entries:
        timing = timing_of(entry)
        if not entry.get("unstable") or timing is None:
            continue
        spread = timing.relative_noise()
        windows = (entry.get("timing") or {}).get("window_medians_ms") or []
        seen = f"its measurement windows gave {', '.join(f'{w:.3g}' for w in windows)} ms" if windows else "its runs varied"
        notes.append({"variant": entry["id"], "label": _describe(entry), "spread": spread, "window_medians_ms": windows,
                      "text": (f"{_describe(entry)} was unstable: {seen} (a {spread:.0%} spread around its p50 of "
                               f"{timing.p50:.3g} ms), so its speed is known only to about ±{spread:.0%}. "
                               "Re-measure on a quieter device before trusting a small difference.")})
    return notes


def near_ties(entries: list[dict]) -> list[dict]:
    """The variants within tolerance that the measurements cannot tell apart: the fastest first, then each it
    does not beat beyond the noise (fastest first); [] when none is within tolerance."""
    within = sorted((e for e in _measured(entries) if e["accuracy"]["within_tolerance"]), key=lambda e: e["latency_ms"]["p50"])
    if not within:
        return []
    fastest = within[0]
    return [fastest, *(e for e in within[1:] if not _ratio(fastest, e).beyond_noise)]


@dataclass
class Recommendation:
    variant: object
    reason: str
    verdict: dict | None = None
    alternatives: list = field(default_factory=list)
    unstable: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"verdict": self.verdict, "alternatives": self.alternatives, "unstable": self.unstable}


def recommendation(entries: list[dict], tolerance: dict) -> Recommendation:
    """Pick the variant to use on one device, and say why in one line plus a row per other family.

    Among the variants within tolerance, the fastest wins only over those it beats beyond the
    measured noise; those it does not beat are a tie, and of the tie the most accurate, then the
    smallest, is recommended. When none is within tolerance: the most accurate, and why."""
    measured = _measured(entries)
    if not measured:
        return Recommendation(None, "No variant was measured successfully on this device; see each task's error.",
                              alternatives=why_not_the_others(entries, None, tolerance))
    within = [e for e in measured if e["accuracy"]["within_tolerance"]]
    if within:
        tied = near_ties(entries)
        chosen = min(tied, key=_preference)
        ties = [(e, _ratio(e, chosen)) for e in sorted(tied, key=lambda e: e["latency_ms"]["p50"])
                if e is not chosen and e["latency_ms"]["p50"] < chosen["latency_ms"]["p50"]]
        verdict = _verdict(chosen, measured, ties)
        reason = verdict["text"]
    else:
        chosen = max(measured, key=lambda e: (quality(e["accuracy"]), -e["latency_ms"]["p50"]))
        reason = (
            f"No variant met the tolerance; the most accurate is {_describe(chosen)} "
            f"({chosen['accuracy']['metric']} {chosen['accuracy']['value']:.4g}, p50 {chosen['latency_ms']['p50']:.3f} ms)."
        )
        verdict = {"variant": chosen["id"], "label": _describe(chosen), "text": reason, "tie": False, "tied_with": [], "speedup": None,
                   "accuracy": {k: chosen["accuracy"].get(k) for k in ("metric", "value", "drop")}}
    return Recommendation(chosen["id"], reason, verdict, why_not_the_others(entries, chosen["id"], tolerance), unstable_notes(entries))


def recommend(entries: list[dict], tolerance: dict) -> tuple[object, str]:
    """The recommended entry's id and the one-line reason (see `recommendation`)."""
    chosen = recommendation(entries, tolerance)
    return chosen.variant, chosen.reason


def fp32_noise(entries: list[dict]) -> list[dict]:
    """What FP32 itself scores on this device, per backend: the floor every other variant is read against."""
    noise = []
    for entry in entries:
        accuracy = entry.get("accuracy") or {}
        if entry.get("precision") != "fp32" or accuracy.get("value") is None:
            continue
        noise.append({"backend": entry["backend"], "metric": accuracy.get("metric"), "output": accuracy.get("output"),
                      "value": accuracy.get("value"), "drop": accuracy.get("drop"), "sqnr_db": accuracy.get("sqnr_db"),
                      "within_tolerance": accuracy.get("within_tolerance")})
    return sorted(noise, key=lambda row: row["backend"])
