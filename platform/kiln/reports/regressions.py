"""When a re-measured variant counts as a regression: slower beyond noise, by Kiln's one rule (workers/noise.py). Pure."""
from __future__ import annotations

from workers.noise import FASTER, Timing, interval_text, latency_ratio, ratio_text


def measurement_timing(*, latency_ms: dict | None, p50_ms: float, std_ms: float = 0.0, runs: int = 0) -> Timing:
    """The timing of one stored measurement: its latency summary (cv, count and the windows its rows keep), else p50, std and runs."""
    latency = latency_ms or {}
    cv = latency.get("cv")
    if cv is None and std_ms and p50_ms:
        cv = std_ms / p50_ms
    return Timing(p50=float(p50_ms), windows=tuple(float(v) for v in latency.get("window_medians_ms") or ()), cv=cv,
                  count=latency.get("count") or runs or None)


def compare(*, measured: Timing, baseline: Timing) -> dict:
    """`{"slowdown": new/old, "flagged", "low", "high", "text"}` for a new measurement against a baseline's.

    Flagged when the baseline is faster than the new measurement beyond noise (`latency_ratio`), the words the decision uses.
    """
    ratio = latency_ratio(baseline, measured)
    slowdown = measured.p50 / baseline.p50 if baseline.p50 > 0 else None
    return {"slowdown": slowdown, "flagged": bool(slowdown) and ratio.comparison == FASTER, "low": ratio.low, "high": ratio.high,
            "text": f"{ratio_text(ratio.ratio)} slower ({interval_text(ratio.low, ratio.high)})"}
