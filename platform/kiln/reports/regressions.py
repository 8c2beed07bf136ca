"""When a re-measured variant counts as slower: beyond the noise both measurements showed. Pure."""
from __future__ import annotations

# A slowdown must exceed this many standard deviations of the noisier run...
NOISE_SIGMAS = 2.0
# ...and this fraction of the baseline, so that a very steady benchmark does not flag 1% drifts.
MIN_SLOWDOWN = 0.05


def compare(*, p50_ms: float, std_ms: float, baseline_p50_ms: float, baseline_std_ms: float) -> dict:
    """`{"slowdown": new/old, "noise_ms", "flagged"}` for a new p50 against a baseline's."""
    noise_ms = NOISE_SIGMAS * max(std_ms or 0.0, baseline_std_ms or 0.0)
    delta = p50_ms - baseline_p50_ms
    slowdown = p50_ms / baseline_p50_ms if baseline_p50_ms > 0 else None
    flagged = bool(slowdown and delta > noise_ms and delta > MIN_SLOWDOWN * baseline_p50_ms)
    return {"slowdown": slowdown, "delta_ms": delta, "noise_ms": noise_ms, "flagged": flagged}
