"""Pure scoring of measured variants: the Pareto set, the recommendation, FP32's noise figure.

The verdict on one variant (`score_accuracy`) is the contract's, shared with the search."""
from __future__ import annotations

from devices.contract import quality, score_accuracy

__all__ = ["fp32_noise", "pareto_ids", "quality", "recommend", "score_accuracy"]


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
    return f"{entry['precision']} on {entry['backend']}"


def _int8_notes(entries: list[dict]) -> list[str]:
    """Say plainly where INT8 is slower than FP32 on the same backend."""
    notes = []
    for backend in sorted({e["backend"] for e in entries}):
        fp32 = next((e for e in entries if e["backend"] == backend and e["precision"] == "fp32" and e.get("latency_ms")), None)
        if fp32 is None:
            continue
        for entry in entries:
            if entry["backend"] == backend and entry["precision"].startswith("int8") and entry.get("latency_ms"):
                ratio = fp32["latency_ms"]["p50"] / entry["latency_ms"]["p50"]
                if ratio < 1.0:
                    notes.append(f"{entry['precision']} does not pay on this device with {backend}: {ratio:.2f}x the speed of FP32.")
    return notes


def recommend(entries: list[dict], tolerance: dict) -> tuple[object, str]:
    """Pick the fastest entry within tolerance; when none is, the most accurate, and say why."""
    measured = [e for e in entries if e.get("latency_ms") and quality(e["accuracy"]) is not None]
    if not measured:
        return None, "No variant was measured successfully on this device; see each task's error."
    within = [e for e in measured if e["accuracy"]["within_tolerance"]]
    notes = _int8_notes(measured)
    if within:
        best = min(within, key=lambda e: e["latency_ms"]["p50"])
        fp32 = next((e for e in measured if e["precision"] == "fp32" and e["backend"] == best["backend"]), None)
        speed = f", {fp32['latency_ms']['p50'] / best['latency_ms']['p50']:.2f}x the speed of FP32 on {best['backend']}" if fp32 and fp32 is not best else ""
        accuracy = best["accuracy"]
        verdict = f"{accuracy['metric']} {accuracy['value']:.4g}" + (f" (drop {accuracy['drop']:.4g})" if accuracy.get("drop") is not None else "")
        reason = f"Fastest variant within tolerance: {_describe(best)}, p50 {best['latency_ms']['p50']:.3f} ms{speed}; {verdict}."
        return best["id"], " ".join([reason, *notes])
    best = max(measured, key=lambda e: (quality(e["accuracy"]), -e["latency_ms"]["p50"]))
    reason = (
        f"No variant met the tolerance; the most accurate is {_describe(best)} "
        f"({best['accuracy']['metric']} {best['accuracy']['value']:.4g}, p50 {best['latency_ms']['p50']:.3f} ms)."
    )
    return best["id"], " ".join([reason, *notes])


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
