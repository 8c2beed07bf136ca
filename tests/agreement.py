"""The agreement check: every view of a job's report agrees with the table it shows.

Used by the decision's unit tests (random devices) and by the e2e tests, which run it over every
finished job they made (tests/conftest.py `every_finished_job_agrees_with_its_report`).
"""
from __future__ import annotations

import pytest

from workers.noise import FASTER, SLOWER, TIE, compare, interval_text, latency_ratio, ratio_text, timing_of
from workers.scoring import PROVISIONAL_BUSY_SHARE, label_of

SIDE_BY_SIDE = "side by side"


def _within(variant: dict) -> bool:
    return bool((variant.get("accuracy") or {}).get("within_tolerance")) and bool((variant.get("latency_ms") or {}).get("p50"))


def _ordered(latency: dict, where: str) -> None:
    """min <= p50 <= max and p50 <= p90 <= p99, for the figures a latency summary has."""
    p50 = latency["p50"]
    slack = 1e-9 * max(1.0, abs(p50))
    if latency.get("min") is not None and latency.get("max") is not None:
        assert latency["min"] - slack <= p50 <= latency["max"] + slack, (where, latency)
    chain = [latency.get(name) for name in ("p50", "p90", "p99") if latency.get(name) is not None]
    assert all(low <= high + slack for low, high in zip(chain, chain[1:])), (where, latency)


def assert_rows_are_one_measurement_set(device: dict) -> None:
    """Every row's figures come from one measurement set, and the first pass of a re-timed row is kept apart.

    - p50 lies between the row's min and max, and p50 <= p90 <= p99 (the first pass, shown apart, holds the same);
    - the row's throughput is its batch over the mean of the same samples;
    - a row re-timed side by side shows no first-pass figure in its own columns: memory and load time are under `first_pass`.
    """
    for variant in device["variants"]:
        where = f"{device.get('target')}: {variant.get('label') or variant.get('key')}"
        latency = variant.get("latency_ms") or {}
        if latency.get("p50") is not None:
            _ordered(latency, where)
            if variant.get("throughput_per_s") and latency.get("mean") and variant.get("batch_size"):
                assert variant["throughput_per_s"] == pytest.approx(variant["batch_size"] * 1000.0 / latency["mean"], rel=1e-6), where
        first = (variant.get("first_pass") or {}).get("latency_ms") or {}
        if first.get("p50") is not None:
            _ordered(first, f"{where} (first pass)")
        if variant.get("measurement_set") == SIDE_BY_SIDE:
            assert variant.get("first_pass"), where
            assert variant.get("peak_memory_mb") is None and variant.get("load_ms") is None, (where, "a first-pass figure in a re-timed row")


def _assert_ratio_is_the_tables(stated: dict, fast: dict, slow: dict, text: str | None = None) -> None:
    """A stated ratio is the one rule's ratio of the two rows the table shows, lies inside its interval, says what the
    interval says, and (where a text states it) is printed with the digits that decide it."""
    again = latency_ratio(timing_of(fast), timing_of(slow))
    assert stated["ratio"] == pytest.approx(again.ratio, rel=1e-9) and stated["low"] == pytest.approx(again.low, rel=1e-9), (stated, again)
    assert stated["low"] <= stated["ratio"] <= stated["high"], stated
    assert stated["comparison"] == compare(stated["low"], stated["high"]) == again.comparison, stated
    if text is not None:
        assert ratio_text(stated["ratio"]) in text and interval_text(stated["low"], stated["high"]) in text, (stated, text)


def _deciding_windows(chosen: dict, baseline: dict | None) -> list[dict]:
    if chosen.get("measurement_set") == SIDE_BY_SIDE or (chosen.get("timing") or {}).get("interleaved_medians_ms"):
        windows = (chosen.get("timing") or {}).get("windows")
        if windows:
            return windows
    rows = [chosen] + ([baseline] if baseline is not None and baseline is not chosen else [])
    return [w for row in rows for w in ((row.get("first_pass") or row.get("timing") or {}).get("windows") or [])]


def assert_decision_agrees(device: dict) -> None:
    """The table's star, the verdict, its stated ratio and "why not the others" all say what the table shows.

    - the star (`recommended`) is the decision's variant;
    - the recommended variant is never slower beyond noise than another variant within the tolerance;
    - the stated speed-up is the one rule's ratio of the table's rows (the paired estimate where both were re-timed side by
      side), lies inside the interval printed beside it, its comparison follows the interval language, and the verdict's
      text prints both with the digits that decide them;
    - each "why not" row that calls a variant slower or a tie has the interval that says so;
    - the decision is provisional exactly when the windows it rests on were busy, and its text says so.
    """
    decision = device.get("decision")
    variants = {variant["id"]: variant for variant in device["variants"]}
    if not decision or decision.get("variant") is None:
        assert device.get("recommended") is None, device.get("recommended")
        return
    assert device["recommended"] == decision["variant"], (device["recommended"], decision["variant"])
    chosen = variants[decision["variant"]]
    assert decision["label"] == label_of(chosen) and decision["label"] in decision["text"], (decision["label"], decision["text"])
    if decision.get("within_tolerance"):
        assert _within(chosen)
        for other in variants.values():
            if other is chosen or not _within(other):
                continue
            ratio = latency_ratio(timing_of(other), timing_of(chosen))
            assert ratio.comparison != FASTER, (f"{label_of(other)} is {ratio.ratio:.3f}x ({ratio.low:.3f}-{ratio.high:.3f}) faster than the "
                                                f"recommended {decision['label']}", decision["text"])
    speedup = decision.get("speedup")
    baseline = variants[speedup["baseline"]] if speedup else None
    if speedup:
        _assert_ratio_is_the_tables(speedup, chosen, baseline, decision["text"])
        assert speedup["comparison"] == decision["comparison"], speedup
        if speedup["comparison"] == TIE:
            assert "faster than FP32" not in decision["text"], decision["text"]
    for tied in decision.get("tied_with") or []:
        _assert_ratio_is_the_tables(tied, variants[tied["variant"]], chosen)
        assert tied["comparison"] != FASTER, tied
    for row in decision.get("alternatives") or []:
        assert row.get("variant") != decision["variant"], row
        other = variants.get(row.get("variant"))
        if other is None or row.get("outcome") not in (SLOWER, TIE):
            continue
        ratio = latency_ratio(timing_of(chosen), timing_of(other))
        assert ratio.comparison == (FASTER if row["outcome"] == SLOWER else TIE), (row, ratio.as_dict())
        assert interval_text(ratio.low, ratio.high) in row["why"], (row, ratio.as_dict())
    if "provisional" in decision:
        windows = [w for w in _deciding_windows(chosen, baseline) if isinstance(w, dict)]
        busy = sum(bool(w.get("busy")) for w in windows)
        expected = bool(windows) and busy > 0 and busy >= PROVISIONAL_BUSY_SHARE * len(windows)
        assert bool(decision["provisional"]) == expected, (decision.get("provisional"), busy, len(windows))
        assert ("provisional: the device was busy" in decision["text"]) == expected, decision["text"]


def assert_search_notes_agree(report: dict) -> None:
    """Every ratio in the search card's notes can be recomputed from the table: each family verdict's and each compile
    option's ratio is the one rule's ratio of the rows it names, "pays"/"won" is its "faster", and the note prints it."""
    search = report.get("search") or {}
    devices = {device["target"]: device for device in report["devices"]}
    for target, verdicts in (search.get("verdicts") or {}).items():
        rows = {(variant.get("key"), variant.get("backend")): variant for variant in devices[target]["variants"]}
        notes = " | ".join((search.get("notes") or {}).get(target) or [])
        for verdict in verdicts.values():
            against = rows[(verdict["against"]["key"], verdict["against"]["backend"])]
            for backend, stated in verdict["comparisons"].items():
                _assert_ratio_is_the_tables(stated, rows[(verdict["fastest"][backend], backend)], against)
                assert (backend in verdict["paying_backends"]) == (stated["comparison"] == FASTER), (verdict, stated)
            assert verdict["reason"] in notes, (verdict["reason"], notes)
            if verdict["comparisons"]:
                best = max(stated["ratio"] for stated in verdict["comparisons"].values())
                assert ratio_text(best) in verdict["reason"], verdict["reason"]
        for outcome in (search.get("compile") or {}).get(target) or []:
            stated = outcome["comparison"]
            _assert_ratio_is_the_tables(stated, rows[(outcome["tuned"], outcome["backend"])], rows[(outcome["base"], outcome["backend"])])
            assert ratio_text(stated["ratio"]) in outcome["text"] and outcome["text"] in notes, (outcome, notes)
            assert (" won: " in outcome["text"]) == (stated["comparison"] == FASTER), outcome


def assert_report_agrees(report: dict) -> None:
    """The whole report: each device's rows, its decision, and the search card's notes (see the functions above)."""
    for device in report["devices"]:
        assert_rows_are_one_measurement_set(device)
        assert_decision_agrees(device)
    assert_search_notes_agree(report)
