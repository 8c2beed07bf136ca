"""Pure scoring of measured variants: tolerance checks, the Pareto set, the recommendation."""
from __future__ import annotations

METRIC_KEYS = {"accuracy": "accuracy", "cosine": "cosine", "sqnr": "sqnr_db", "top1_agreement": "top1_agreement"}
EPSILON = 1e-9


def resolve_metric(tolerance: dict, accuracy: dict) -> str:
    metric = tolerance.get("metric", "auto")
    if metric != "auto":
        return metric
    if accuracy.get("accuracy") is not None:
        return "accuracy"
    if accuracy.get("top1_agreement") is not None:
        return "top1_agreement"
    return "cosine"


def score_accuracy(tolerance: dict, accuracy: dict, metric: str) -> dict:
    """The tolerance verdict for one variant's measured accuracy."""
    value = accuracy.get(METRIC_KEYS[metric])
    result = {**accuracy, "metric": metric, "value": value, "reference_value": None, "drop": None, "within_tolerance": False}
    if value is None:
        return result
    if metric == "sqnr":
        result["within_tolerance"] = value >= tolerance.get("min_value", 30.0) - EPSILON
        return result
    reference = accuracy.get("reference_accuracy") if metric == "accuracy" else 1.0
    if reference is None:
        return result
    drop = reference - value
    result.update(reference_value=reference, drop=drop, within_tolerance=drop <= tolerance.get("max_drop", 0.01) + EPSILON)
    return result


def pareto_ids(entries: list[dict]) -> set:
    """Entries not beaten on both latency (lower) and accuracy value (higher)."""
    measured = [e for e in entries if e.get("latency_ms") and e["accuracy"].get("value") is not None]
    front = set()
    for entry in measured:
        latency, value = entry["latency_ms"]["p50"], entry["accuracy"]["value"]
        dominated = any(
            other["latency_ms"]["p50"] <= latency and other["accuracy"]["value"] >= value
            and (other["latency_ms"]["p50"] < latency or other["accuracy"]["value"] > value)
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
    measured = [e for e in entries if e.get("latency_ms") and e["accuracy"].get("value") is not None]
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
    best = max(measured, key=lambda e: (e["accuracy"]["value"], -e["latency_ms"]["p50"]))
    reason = (
        f"No variant met the tolerance; the most accurate is {_describe(best)} "
        f"({best['accuracy']['metric']} {best['accuracy']['value']:.4g}, p50 {best['latency_ms']['p50']:.3f} ms)."
    )
    return best["id"], " ".join([reason, *notes])
