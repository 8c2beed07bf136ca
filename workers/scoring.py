"""Pure scoring of measured variants: the Pareto set, the decision per device, FP32's noise figure.

The decision (`decide`) is the one object every view of a recommendation renders (DESIGN.md section 7):
the chosen variant and what it runs in, its speed-up over FP32 with the interval and the measurements it
comes from, its accuracy cost, each other family and why it lost, failed builds and why, and the timing
noise of the device told once. It is computed here, once per device, by the report stage; the report
page, the job page, the CLI, the package README and the performance database only render it.

Speed comparisons use Kiln's one noise rule (workers/noise.py `latency_ratio`, `compare`): wholly above 1.0 is faster,
wholly below is slower, an interval containing 1.0 is a tie. The recommended variant is, by
construction, never slower beyond noise than another variant within the tolerance: it is chosen among
the variants no other variant within the tolerance beats.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kiln_contract.contract import quality, score_accuracy
from kiln_contract.labels import EFFECTIVE_PRECISIONS, effective_precision, variant_label
from workers.noise import FASTER, INTERLEAVED, SLOWER, TIE, LatencyRatio, interval_text, latency_ratio, ratio_text, timing_of

__all__ = ["REFUSED", "decide", "failure_reason", "fp32_noise", "label_of", "pareto_ids", "quality", "recommend", "recommendation",
           "score_accuracy"]

FAILED_ROWS_SHOWN = 20
# A built variant a target runtime refused on the host (a failed build's status otherwise): it never reached a device there.
REFUSED = "refused"


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


# -- names ------------------------------------------------------------------------------------

def _compile(entry: dict) -> dict:
    return entry.get("compile") or (entry.get("options") or {}).get("compile") or {}


def effective_of(entry: dict) -> str:
    """What the entry's variant runs in on its backend (kiln_contract.labels)."""
    return entry.get("effective_precision") or effective_precision(entry.get("precision") or "fp32", _compile(entry), entry.get("backend"),
                                                                   entry.get("options"))


def label_of(entry: dict) -> str:
    """The entry's name: effective precision first, recipe and compile options after it, then the backend."""
    return entry.get("label") or variant_label(key=entry.get("key"), precision=entry.get("precision") or "fp32",
                                               backend=entry.get("backend") or "?", compile_options=_compile(entry), options=entry.get("options"))


def _measured(entries: list[dict]) -> list[dict]:
    return [e for e in entries if e.get("latency_ms") and e["latency_ms"].get("p50") and quality(e["accuracy"]) is not None]


def _within(entry: dict) -> bool:
    return bool((entry.get("accuracy") or {}).get("within_tolerance"))


def _ratio(fast: dict, slow: dict) -> LatencyRatio:
    return latency_ratio(timing_of(fast), timing_of(slow))


def _interval(ratio: LatencyRatio) -> str:
    rounds = f", {ratio.rounds} paired rounds" if ratio.source == INTERLEAVED and ratio.rounds else ""
    return f"{interval_text(ratio.low, ratio.high)}{rounds}"


def _inverse(ratio: LatencyRatio) -> LatencyRatio:
    """The same comparison read the other way round (how much faster `slow` is than `fast`)."""
    return LatencyRatio(1 / ratio.ratio, 1 / ratio.high, 1 / ratio.low, ratio.source, ratio.rounds, tuple(1 / value for value in ratio.per_round))


def _ratio_json(ratio: LatencyRatio, **extra) -> dict:
    return {**extra, **ratio.as_dict(), "per_round": [round(value, 4) for value in ratio.per_round]}


# -- the choice ----------------------------------------------------------------------------

def _preference(entry: dict) -> tuple:
    """Among variants whose speeds tie: the more accurate first, then the smaller, then the simpler (fewer compile
    options: a tuned build that is not faster beyond noise loses to the runtime's defaults), then the faster-measured."""
    return (-quality(entry["accuracy"]), entry.get("size_bytes") or 0, len(_compile(entry)), entry["latency_ms"]["p50"])


def _unbeaten(within: list[dict]) -> list[dict]:
    """The variants within tolerance that no other variant within tolerance is faster than beyond noise."""
    unbeaten = [entry for entry in within if not any(other is not entry and _ratio(other, entry).comparison == FASTER for other in within)]
    # Medians of ratios need not order like ratios of medians: with none left unbeaten, the fastest-measured stands.
    return unbeaten or [min(within, key=lambda e: e["latency_ms"]["p50"])]


def _won_on(chosen: dict, other: dict) -> str:
    """Why `chosen` is preferred to `other` when their speeds tie, in the words of the one fact that decided it."""
    mine, theirs = chosen["accuracy"], other["accuracy"]
    if quality(mine) != quality(theirs):
        metric = mine.get("metric") or "accuracy"
        if mine.get("drop") is not None and theirs.get("drop") is not None:
            return f"it is more accurate ({metric} drop {_drop(mine['drop'])} against {_drop(theirs['drop'])})"
        return f"it is more accurate ({metric} {mine.get('value'):.4g} against {theirs.get('value'):.4g})"
    if (chosen.get("size_bytes") or 0) != (other.get("size_bytes") or 0):
        return f"it is smaller ({_size(chosen.get('size_bytes'))} against {_size(other.get('size_bytes'))})"
    if len(_compile(chosen)) != len(_compile(other)):
        return "it uses fewer compile options (closer to the runtime's defaults)"
    return "it measured faster"


def _drop(value: float) -> str:
    return "0" if value <= 0 else f"{value:.2g}"


def _size(size: int | None) -> str:
    if not size:
        return "unknown size"
    return f"{size / 1e6:.3g} MB" if size >= 1e5 else f"{size / 1e3:.3g} kB"


def _fp32_baseline(measured: list[dict], chosen: dict) -> dict | None:
    """FP32 with the runtime's defaults on the chosen variant's backend; else any FP32 there; else the fastest FP32."""
    fp32 = [e for e in measured if effective_of(e) == "fp32"]
    same = [e for e in fp32 if e["backend"] == chosen["backend"]]
    plain = [e for e in same if not _compile(e)]
    pool = plain or same or fp32
    return min(pool, key=lambda e: e["latency_ms"]["p50"]) if pool else None


def _speed(chosen: dict, baseline: dict | None, speedup: LatencyRatio | None) -> tuple[str, str]:
    """(the speed clause of the verdict, a short cell for lists) against FP32."""
    where = f" on {baseline['backend']}" if baseline is not None else ""
    if baseline is None:
        return "no FP32 was measured on this device to compare with", "no FP32 measured"
    if speedup is None:
        return "it is the FP32 reference", "FP32 itself"
    if speedup.comparison == FASTER:
        return f"{ratio_text(speedup.ratio)} faster than FP32{where} ({_interval(speedup)})", f"{ratio_text(speedup.ratio)} faster"
    if speedup.comparison == SLOWER:
        return f"{ratio_text(speedup.ratio)} FP32's speed{where}, slower ({_interval(speedup)})", f"{ratio_text(speedup.ratio)} (slower)"
    return f"as fast as FP32{where} within noise: {ratio_text(speedup.ratio)} ({_interval(speedup)}), a tie", f"{ratio_text(speedup.ratio)} (tie)"


def _cost(accuracy: dict) -> str:
    drop = accuracy.get("drop")
    if accuracy.get("value") is None:
        return "accuracy not measured"
    if drop is None:
        return f"{accuracy['metric']} {accuracy['value']:.4g}"
    if drop <= 0:
        return f"no accuracy cost ({accuracy['metric']} {accuracy['value']:.4g})"
    return f"costs {drop:.2g} {accuracy['metric']} ({accuracy['value']:.4g})"


def _ties_clause(chosen: dict, ties: list[tuple[dict, LatencyRatio]]) -> str:
    if not ties:
        return ""
    other, ratio = ties[0]
    more = f" (and {len(ties) - 1} more)" if len(ties) > 1 else ""
    return (f"; {label_of(other)}{more} measured {ratio_text(ratio.ratio)} faster ({_interval(ratio)}), a tie, "
            f"and {label_of(chosen)} is recommended because {_won_on(chosen, other)}")


def _others_clause(measured: list[dict], chosen: dict, baseline: dict | None, ties: list[tuple[dict, LatencyRatio]]) -> str:
    """How the chosen variant stands against the rest within the tolerance (those the verdict did not already name)."""
    named = {id(chosen), id(baseline), *(id(other) for other, _ in ties)}
    others = [e for e in measured if _within(e) and id(e) not in named]
    if not others:
        return ""
    slower = sum(_ratio(chosen, e).comparison == FASTER for e in others)
    if slower == len(others):
        return f"; the {len(others)} other variant(s) within the tolerance are slower"
    return f"; of the {len(others)} other variant(s) within the tolerance, {slower} are slower and {len(others) - slower} tie with it"


def _choose(measured: list[dict]) -> tuple[dict, list[dict]]:
    """The chosen entry and the entries it was chosen among (the unbeaten within tolerance; else all measured)."""
    within = [e for e in measured if _within(e)]
    if not within:
        return max(measured, key=lambda e: (quality(e["accuracy"]), -e["latency_ms"]["p50"])), []
    unbeaten = _unbeaten(within)
    # Where the device timed its finalists side by side, the pick is one of them: the rest were slower in the first pass
    # than every finalist, and a first pass read against paired rounds ties too easily to decide between equals.
    paired_ones = [e for e in unbeaten if (e.get("timing") or {}).get("interleaved_medians_ms")]
    return min(paired_ones or unbeaten, key=_preference), unbeaten


# -- why not the others -----------------------------------------------------------------------

def failure_reason(error: str) -> str:
    """A failure in the words a user needs: out of memory, out of time, the backend cannot read the model, or the error."""
    text = " ".join(str(error or "").split())
    lowered = text.lower()
    if "memory budget" in lowered or "memoryerror" in lowered or "out of memory" in lowered:
        return f"ran out of memory: {text[:200]}"
    if "took longer than" in lowered or "timeout" in lowered or "time limit" in lowered:
        return f"ran out of time: {text[:200]}"
    if any(marker in lowered for marker in ("invalid_graph", "invalidgraph", "not_implemented", "unsupported", "could not read", "cannot read",
                                            "failed to load", "load model", "is not supported", "no kernel")):
        return f"the backend cannot read this model: {text[:200]}"
    return f"failed: {text[:200]}"


def _why_not(entry: dict, chosen: dict | None, tolerance: dict) -> tuple[str, str]:
    """(outcome, why) for one variant that is not the recommendation."""
    if entry.get("error"):
        return "failed", failure_reason(entry["error"])
    if not entry.get("latency_ms") or quality(entry["accuracy"]) is None:
        done = entry.get("status") in ("succeeded", "failed", "canceled")
        return ("not measured", "not measured") if done else ("measuring", "still measuring")
    accuracy = entry["accuracy"]
    if not accuracy.get("within_tolerance"):
        allowed = f" > allowed {tolerance['max_drop']:.2g}" if accuracy.get("drop") is not None and tolerance.get("max_drop") is not None else ""
        drop = f" drop {accuracy['drop']:.2g}{allowed}" if accuracy.get("drop") is not None else f" {accuracy.get('value')}"
        return "outside tolerance", f"outside the tolerance ({accuracy.get('metric')}{drop})"
    if chosen is None:
        return "not chosen", ""
    ratio = _ratio(chosen, entry)
    if ratio.comparison == FASTER:
        return SLOWER, f"slower: the recommended is {ratio_text(ratio.ratio)} faster ({_interval(ratio)})"
    if ratio.comparison == SLOWER:
        # Not chosen although faster: it is faster only against the chosen one, which another variant ties with.
        return FASTER, (f"{ratio_text(1 / ratio.ratio)} faster ({_interval(_inverse(ratio))}) than the recommended, which ties with a "
                        "faster variant")
    return TIE, f"a tie on speed ({ratio_text(ratio.ratio)}, {_interval(ratio)}), and the recommended was preferred because {_won_on(chosen, entry)}"


def _family_rows(entries: list[dict], chosen: dict | None, tolerance: dict) -> list[dict]:
    """Per effective-precision family, its best other variant and why it lost."""
    rows = []
    chosen_id = chosen["id"] if chosen else None
    order = {name: index for index, name in enumerate(EFFECTIVE_PRECISIONS)}
    for name in sorted({effective_of(e) for e in entries}, key=lambda n: (order.get(n, len(order)), n)):
        members = [e for e in entries if effective_of(e) == name and e["id"] != chosen_id]
        if not members:
            continue
        # The family's best showing: measured within tolerance, then measured, then anything; fastest first.
        best = min(members, key=lambda e: (not (e.get("latency_ms") and _within(e)), not e.get("latency_ms"),
                                           (e.get("latency_ms") or {}).get("p50") or 0.0))
        outcome, why = _why_not(best, chosen, tolerance)
        rows.append({"family": name, "variants": len(members), "variant": best["id"], "label": label_of(best),
                     "p50_ms": (best.get("latency_ms") or {}).get("p50"), "drop": best["accuracy"].get("drop"),
                     "metric": best["accuracy"].get("metric"), "outcome": outcome, "why": why})
    return rows


def _failure_rows(entries: list[dict], family_rows: list[dict], failed_builds: list[dict]) -> list[dict]:
    """Every failure not already a family's row: device tasks that failed, and builds that never reached a device."""
    shown = {row["variant"] for row in family_rows}
    rows = []
    for entry in entries:
        if entry.get("error") and entry["id"] not in shown:
            rows.append({"family": effective_of(entry), "variants": 1, "variant": entry["id"], "label": label_of(entry), "p50_ms": None,
                         "drop": None, "metric": None, "outcome": "failed", "why": failure_reason(entry["error"])})
    for build in failed_builds:
        label = label_of({**build, "backend": ", ".join(build.get("backends") or []) or "the host"})
        refused = build.get("status") == REFUSED
        why = failure_reason(build.get("error") or "")
        rows.append({"family": effective_of(build), "variants": 1, "variant": None, "build": build.get("variant"), "label": label,
                     "p50_ms": None, "drop": None, "metric": None, "outcome": REFUSED if refused else "build failed",
                     "why": f"never reached the device: {why}" if refused else f"never reached the device: the build {why}"})
    return rows[:FAILED_ROWS_SHOWN]


# -- noise, told once per device ----------------------------------------------------------------

def _first_pass_windows(entry: dict) -> list:
    """The quiet windows of an entry's first pass (a re-timed row keeps them apart, under `first_pass`)."""
    first_pass = entry.get("first_pass")
    return list((first_pass if first_pass is not None else entry.get("timing") or {}).get("windows") or [])


def _first_pass_timing(entry: dict):
    """The timing of an entry's first pass (a re-timed row's own timing is its side-by-side rounds')."""
    first_pass = entry.get("first_pass")
    if not first_pass or not (first_pass.get("latency_ms") or {}).get("p50"):
        return timing_of(entry)
    return timing_of({"latency_ms": first_pass["latency_ms"], "timing": {"window_medians_ms": first_pass.get("window_medians_ms") or []}})


def _windows(entries: list[dict], retime_windows: list[dict]) -> tuple[int, int, int, list[str]]:
    """(windows re-taken because the device was busy, windows still busy when reported, windows a build of the host did not
    pause for, what kept it busy): each first-pass benchmark's window, and each round of the side-by-side re-timing once."""
    retaken = busy = unpaused = 0
    windows = [window for entry in entries for window in _first_pass_windows(entry)] + list(retime_windows)
    for window in windows:
        if isinstance(window, dict):
            retaken += int(window.get("retaken") or 0)
            busy += bool(window.get("busy"))
            unpaused += window.get("builds_paused") is False
    return retaken, busy, unpaused, _culprits(windows)


def _culprits(windows: list) -> list[str]:
    """What kept the device busy in these windows, busiest first as each window named them (at most three)."""
    culprits: list[str] = []
    for window in windows:
        for name in (window.get("busiest") or []) if isinstance(window, dict) else []:
            if name not in culprits:
                culprits.append(str(name))
    return culprits[:3]


# A decision is provisional when at least this share of the windows it rests on were still busy after re-taking: paired rounds
# cancel load that comes and goes, so a few busy rounds among many barely move the median of their ratios, but load that
# stays (a process Kiln does not control on the device's cores) shifts how each variant runs, not only how long.
PROVISIONAL_BUSY_SHARE = 0.25


def _deciding_windows(chosen: dict, baseline: dict | None, measurement: dict | None, retime: dict | None) -> tuple[list[dict], str]:
    """The windows the decision rests on, and what they are: the side-by-side rounds when the chosen variant was re-timed,
    else the first-pass windows of the chosen variant and its FP32 baseline."""
    if measurement is not None and (chosen.get("timing") or {}).get("interleaved_medians_ms") and (retime or {}).get("windows"):
        return [w for w in retime["windows"] if isinstance(w, dict)], "side-by-side rounds"
    entries = [chosen] + ([baseline] if baseline is not None and baseline is not chosen else [])
    return [w for entry in entries for w in _first_pass_windows(entry) if isinstance(w, dict)], "timing windows"


def provisional(windows: list[dict], what: str, retime: dict | None = None) -> dict | None:
    """Whether a decision resting on `windows` is provisional (PROVISIONAL_BUSY_SHARE of them busy), and the words for it."""
    busy = sum(bool(window.get("busy")) for window in windows)
    if not windows or busy == 0 or busy < PROVISIONAL_BUSY_SHARE * len(windows):
        return None
    who = _culprits([window for window in windows if window.get("busy")])
    attempts = int((retime or {}).get("quiet_attempts") or 0)
    text = f"provisional: the device was busy in {busy} of the {len(windows)} {what} the decision rests on"
    text += f" ({', '.join(who)})" if who else ""
    if attempts:
        text += f", still after {attempts} re-timing(s) that waited for a quiet device"
    return {"busy": busy, "windows": len(windows), "attempts": attempts, "busiest": who, "text": text}


def _noise(entries: list[dict], measurement: dict | None, retime_windows: list[dict] | None = None) -> dict:
    """The device's timing noise in one paragraph: unstable first-pass runs, windows re-taken, and what the decision rests on."""
    timed = [e for e in entries if timing_of(e) is not None]
    unstable = [e for e in timed if e.get("unstable")]
    spreads = [_first_pass_timing(e).relative_noise() for e in unstable]
    retaken, busy, unpaused, culprits = _windows(entries, retime_windows or [])
    sentences = []
    if unstable:
        sentences.append(f"{len(unstable)} of {len(timed)} first-pass benchmarks on this device were unstable (their windows disagreed by "
                         f"up to {max(spreads):.0%}), so first-pass timings are known only roughly.")
    if retaken:
        who = f" ({', '.join(culprits)})" if culprits else ""
        sentences.append(f"{retaken} measurement window(s) were re-taken because other processes kept the device busy{who}.")
    if busy:
        sentences.append(f"{busy} window(s) were still busy after re-taking and are marked; their figures are the least trustworthy.")
    if unpaused:
        sentences.append(f"{unpaused} window(s) were timed while a build on this host did not pause (a worker that does not share the "
                         "agent's KILN_QUIET_DIR, or an older one).")
    if measurement and measurement.get("rounds"):
        sentences.append(f"The decision rests on {measurement['rounds']} rounds of the finalists timed side by side on the device "
                         f"({measurement.get('stopped_text') or measurement.get('stopped') or 'done'}): each round's ratio pairs timings taken "
                         "moments apart, so load that comes and goes cancels out.")
    elif unstable:
        sentences.append("The finalists were not re-timed side by side, so the intervals below come from the first pass.")
    return {"text": " ".join(sentences), "unstable": len(unstable), "timed": len(timed), "retaken": retaken, "busy": busy, "unpaused": unpaused,
            "max_spread": max(spreads) if spreads else 0.0}


STOPPED_TEXT = {"separated": "stopped once the leader was faster than every rival at 95%",
                "tie settled": "stopped once every rival was either beaten or a tie within 2%",
                "cap": "stopped at the round cap; what did not separate by then is a tie",
                "time": "stopped after the time a re-timing may hold a device (while other jobs wait for it, or at the end "
                        "of the search's time budget); what did not separate by then is a tie"}


def _measurement(entries: list[dict], chosen: dict | None, retime: dict | None) -> dict | None:
    """The side-by-side measurement set, when the device made one: rounds, why it stopped, each finalist's per-round ratio."""
    finalists = [e for e in entries if (e.get("timing") or {}).get("interleaved_medians_ms")]
    if len(finalists) < 2:
        return None
    rounds = len(finalists[0]["timing"]["interleaved_medians_ms"])
    stopped = (retime or {}).get("stopped")
    rows = []
    for entry in sorted(finalists, key=lambda e: e["latency_ms"]["p50"]):
        row = {"variant": entry["id"], "label": label_of(entry), "p50_ms": entry["latency_ms"]["p50"],
               "round_medians_ms": [round(v, 5) for v in entry["timing"]["interleaved_medians_ms"]]}
        if chosen is not None and entry is not chosen and (chosen.get("timing") or {}).get("interleaved_medians_ms"):
            row["against_recommended"] = _ratio_json(_ratio(chosen, entry))
        rows.append(row)
    return {"source": INTERLEAVED, "rounds": rounds, "stopped": stopped, "stopped_text": STOPPED_TEXT.get(stopped or "", ""),
            "finalists": rows}


# -- the decision -----------------------------------------------------------------------------

def decide(entries: list[dict], tolerance: dict, *, failed_builds: list[dict] | None = None, retime: dict | None = None) -> dict:
    """The recommendation on one device, as one object (see the module docstring); `variant` is None when nothing was measured.

    `failed_builds` are variants whose host build failed (`{"variant", "key", "precision", "options", "backends", "error"}`);
    `retime` is the device's side-by-side re-timing summary (`{"rounds", "stopped", "windows", "quiet_attempts"}`) when it made
    one. `provisional` is set (with its words, also at the end of `text`) when the windows the decision rests on were busy.
    """
    failed_builds = list(failed_builds or [])
    measured = _measured(entries)
    if not measured:
        rows = _family_rows(entries, None, tolerance)
        text = "No variant was measured successfully on this device; see each task's error."
        return {"variant": None, "label": None, "effective_precision": None, "backend": None, "text": text, "speed": None, "short": None,
                "cost": None, "comparison": None, "tie": False, "tied_with": [], "speedup": None, "accuracy": None, "within_tolerance": False,
                "alternatives": rows + _failure_rows(entries, rows, failed_builds), "noise": _noise(entries, None),
                "measurement": None, "provisional": None}
    chosen, unbeaten = _choose(measured)
    measurement = _measurement(entries, chosen, retime)
    if unbeaten:
        # The variants that measured faster than the chosen one (by the one rule's point estimate) yet do not beat it: ties.
        ties = sorted(((e, ratio) for e in unbeaten if e is not chosen and (ratio := _ratio(e, chosen)).ratio > 1.0), key=lambda tie: -tie[1].ratio)
        baseline = _fp32_baseline(measured, chosen)
        speedup = _ratio(chosen, baseline) if baseline is not None and baseline is not chosen else None
        speed, short = _speed(chosen, baseline, speedup)
        text = f"Use {label_of(chosen)}: {speed}{_ties_clause(chosen, ties)}{_others_clause(measured, chosen, baseline, ties)}; {_cost(chosen['accuracy'])}"
    else:
        ties, baseline, speedup = [], None, None
        short = "tolerance not met"
        speed = "no variant met the tolerance"
        text = (f"No variant met the tolerance; the most accurate is {label_of(chosen)} "
                f"({chosen['accuracy']['metric']} {chosen['accuracy']['value']:.4g}, p50 {chosen['latency_ms']['p50']:.3f} ms)")
    busy = provisional(*_deciding_windows(chosen, baseline, measurement, retime), retime)
    if busy:
        text, short = f"{text}; {busy['text']}", f"{short}, provisional"
    text += "."
    rows = _family_rows(entries, chosen, tolerance)
    accuracy = chosen["accuracy"]
    return {
        "variant": chosen["id"], "label": label_of(chosen), "effective_precision": effective_of(chosen), "backend": chosen["backend"],
        "text": text, "speed": speed, "short": short, "cost": _cost(accuracy),
        "comparison": speedup.comparison if speedup else None, "tie": bool(ties),
        "tied_with": [_ratio_json(ratio, variant=other["id"], label=label_of(other), reason=_won_on(chosen, other)) for other, ratio in ties],
        "speedup": _ratio_json(speedup, baseline=baseline["id"], baseline_label=label_of(baseline)) if speedup else None,
        "accuracy": {"metric": accuracy.get("metric"), "value": accuracy.get("value"), "drop": accuracy.get("drop")},
        "within_tolerance": _within(chosen),
        "alternatives": rows + _failure_rows(entries, rows, failed_builds),
        "noise": _noise(entries, measurement, (retime or {}).get("windows")),
        "measurement": measurement,
        "provisional": busy,
    }


@dataclass
class Recommendation:
    """The decision, with the two fields most callers want at hand."""

    variant: object
    reason: str
    decision: dict = field(default_factory=dict)


def recommendation(entries: list[dict], tolerance: dict, **context) -> Recommendation:
    decision = decide(entries, tolerance, **context)
    return Recommendation(decision["variant"], decision["text"], decision)


def recommend(entries: list[dict], tolerance: dict) -> tuple[object, str]:
    """The recommended entry's id and the one-line verdict (see `decide`)."""
    decision = decide(entries, tolerance)
    return decision["variant"], decision["text"]


def fp32_noise(entries: list[dict]) -> list[dict]:
    """What FP32 itself scores on this device, per backend: the floor every other variant is read against."""
    noise = []
    for entry in entries:
        accuracy = entry.get("accuracy") or {}
        if entry.get("precision") != "fp32" or _compile(entry) or accuracy.get("value") is None:
            continue
        noise.append({"backend": entry["backend"], "metric": accuracy.get("metric"), "output": accuracy.get("output"),
                      "value": accuracy.get("value"), "drop": accuracy.get("drop"), "sqnr_db": accuracy.get("sqnr_db"),
                      "within_tolerance": accuracy.get("within_tolerance")})
    return sorted(noise, key=lambda row: row["backend"])
