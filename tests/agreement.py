"""The agreement check: every view of one device's decision agrees with the device's own table.

Used by the decision's unit tests (random devices) and by the e2e tests, which run it over every
finished job they made (tests/e2e/test_decision_agreement.py and the search stack).
"""
from __future__ import annotations

import pytest

from workers.noise import FASTER, SLOWER, TIE, compare, latency_ratio, timing_of
from workers.scoring import label_of


def _within(variant: dict) -> bool:
    return bool((variant.get("accuracy") or {}).get("within_tolerance")) and bool((variant.get("latency_ms") or {}).get("p50"))


def assert_decision_agrees(device: dict) -> None:
    """The table's star, the verdict, its stated ratio and "why not the others" all say what the table shows.

    - the star (`recommended`) is the decision's variant;
    - the recommended variant is never slower beyond noise than another variant within the tolerance;
    - the stated speed-up is the table's own ratio (FP32's p50 over the recommended's), its comparison follows the
      interval language, and the verdict's text says that ratio;
    - each "why not" row that calls a variant slower or a tie has the interval that says so.
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
    if speedup:
        baseline = variants[speedup["baseline"]]
        assert speedup["ratio"] == pytest.approx(baseline["latency_ms"]["p50"] / chosen["latency_ms"]["p50"], rel=1e-9), speedup
        assert speedup["comparison"] == compare(speedup["low"], speedup["high"]) == decision["comparison"], speedup
        assert f"{speedup['ratio']:.2f}x" in decision["text"], decision["text"]
        if speedup["comparison"] == TIE:
            assert "faster than FP32" not in decision["text"], decision["text"]
    for row in decision.get("alternatives") or []:
        assert row.get("variant") != decision["variant"], row
        other = variants.get(row.get("variant"))
        if other is None or row.get("outcome") not in (SLOWER, TIE):
            continue
        ratio = latency_ratio(timing_of(chosen), timing_of(other))
        assert ratio.comparison == (FASTER if row["outcome"] == SLOWER else TIE), (row, ratio.as_dict())
