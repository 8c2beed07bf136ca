"""What the auto search says about the families it measured: which pay, on which runtime, and which compile options won.

The planner (workers.quantize.search) acts on these verdicts, and the report (kiln.reports.selectors) prints
their reasons as the search card's notes, so both say the same thing about the same measurements. "Pays" and
"won" are Kiln's one noise rule (workers/noise.py `latency_ratio`): faster beyond noise, the decision's words.
"""

from __future__ import annotations

from typing import Any

from devices.backends.options import describe as describe_compile_options
from workers.noise import FASTER, LatencyRatio, latency_ratio, ratio_text, timing_of
from workers.quantize.entries import entry_p50, entry_passes, measured_on
from workers.quantize.families import (
    COMPILE_SEPARATOR,
    FAMILY_NAMES,
    INT8_FAMILIES,
    KEEP_FLOAT_RUNTIMES,
    NATIVE_INT8_KEYS,
    PROBE_CHOICES,
    PROBE_EVIDENCE,
    PROBES,
    VENDOR_EVIDENCE,
    is_vendor_default,
)
from workers.quantize.isa_families import int8_choice
from workers.quantize.runtimes import ONNX_RUNTIMES

REOPENED_NOTE = (" (reopened: without integer dot products INT8 was not proposed until a vendor INT8 default beat "
                 "FP32 beyond noise)")


def entry_ratio(fast: dict[str, Any], slow: dict[str, Any]) -> LatencyRatio:
    """How much faster one measured entry is than another, by Kiln's one noise rule (workers/noise.py `latency_ratio`)."""
    return latency_ratio(timing_of(fast), timing_of(slow))


def faster_beyond_noise(fast: dict[str, Any], slow: dict[str, Any]) -> bool:
    return entry_ratio(fast, slow).comparison == FASTER


def family_verdicts(measured: list[dict[str, Any]], *, isa: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Per family (by precision): its probe's speed-up over the device's best FP32, per backend, and whether it pays.

    `{precision: {"family", "probe", "evidence", "speedup": {backend: x}, "fastest": {backend: key}, "paying_backends",
    "reason", "against", "comparisons": {backend: LatencyRatio.as_dict()}}}` (`against`: the best FP32's key and backend); a family whose probe failed to build or measure pays nowhere. INT8 is judged per runtime on that runtime's
    own build: ONNX Runtime by Kiln's QDQ probe, OpenVINO and LiteRT by their native INT8 (`NATIVE_INT8_KEYS`). Where
    `isa` has no integer dot products, the INT8 families' probes were never proposed: their evidence is then the vendor
    INT8 defaults measured beside FP32 (`evidence` "vendor defaults"), and where one of those pays the family is reopened
    on that backend.
    """
    fp32 = [entry for entry in measured if entry.get("precision") == "fp32" and entry_p50(entry) is not None
            and not entry.get("compile")]
    if not fp32:
        return {}
    best_fp32 = min(fp32, key=entry_p50)
    pruned = isa is not None and not int8_choice(isa).proposed
    vendor_int8 = [entry for entry in measured if is_vendor_default(entry) and entry.get("precision") == "int8"]
    verdicts: dict[str, dict[str, Any]] = {}
    for precision, probe in PROBES.items():
        entries = [entry for entry in measured if entry.get("key") in PROBE_CHOICES[precision]]
        evidence = PROBE_EVIDENCE
        if not entries and pruned and precision in INT8_FAMILIES:
            entries, evidence = vendor_int8, VENDOR_EVIDENCE
        elif precision == "int8":
            entries += [entry for entry in measured if entry.get("key") in NATIVE_INT8_KEYS and not entry.get("compile")]
        if not entries:
            continue
        comparisons, fastest = _comparisons(entries, best_fp32)
        speedup = {backend: ratio.ratio for backend, ratio in comparisons.items()}
        paying = [backend for backend, ratio in comparisons.items() if ratio.comparison == FASTER]
        name = FAMILY_NAMES[precision]
        # Pruned, yet its own probe was measured: a vendor INT8 default beat FP32 first and reopened the family.
        reopened = pruned and precision in INT8_FAMILIES and evidence == PROBE_EVIDENCE
        reason = (_verdict_reason(name, evidence, speedup, paying, best_fp32) + _per_backend(speedup, fastest)
                  + (REOPENED_NOTE if reopened else ""))
        verdicts[precision] = {"family": name, "probe": probe, "evidence": evidence, "speedup": speedup, "fastest": fastest,
                               "paying_backends": paying, "reason": reason, "reopened": reopened,
                               "against": {"key": best_fp32.get("key"), "backend": best_fp32.get("backend")},
                               "comparisons": {backend: ratio.as_dict() for backend, ratio in comparisons.items()}}
    return verdicts


def ranking_pays(verdicts: dict[str, dict[str, Any]]) -> bool:
    """Whether ranking nodes by sensitivity can guide anything: it chooses the nodes Kiln's INT8 refinements keep in float,
    so it pays once INT8 paid on a runtime where Kiln refines it (ONNX Runtime's QDQ, OpenVINO's NNCF IR; not LiteRT)
    or INT8-dynamic paid."""
    readers = {"int8": KEEP_FLOAT_RUNTIMES, "int8-dynamic": ONNX_RUNTIMES}
    return any(set(verdicts.get(precision, {}).get("paying_backends") or []) & set(backends) for precision, backends in readers.items())


def _comparisons(entries: list[dict[str, Any]], best_fp32: dict[str, Any]) -> tuple[dict[str, LatencyRatio], dict[str, str]]:
    """Per backend, the fastest entry against the best FP32 (`entry_ratio`), and that entry's key."""
    fastest: dict[str, dict[str, Any]] = {}
    for entry in entries:
        backend = entry.get("backend")
        if entry_p50(entry) is not None and (backend not in fastest or entry_p50(entry) < entry_p50(fastest[backend])):
            fastest[backend] = entry
    comparisons = {backend: entry_ratio(fastest[backend], best_fp32) for backend in sorted(fastest, key=str)}
    return comparisons, {backend: fastest[backend].get("key", "") for backend in comparisons}


def _per_backend(speedup: dict[str, float], fastest: dict[str, str]) -> str:
    """Each runtime's own figure, where the family was measured on more than one ("onnxruntime int8-minmax 0.99x")."""
    if len(speedup) < 2:
        return ""
    return " (" + "; ".join(f"{backend} {fastest[backend]} {ratio_text(speedup[backend])}" for backend in speedup) + ")"


def _verdict_reason(name: str, evidence: str, speedup: dict[str, float], paying: list[str], best_fp32: dict[str, Any]) -> str:
    best = max(speedup.values()) if speedup else None
    fp32_on = best_fp32.get("backend")
    if evidence == VENDOR_EVIDENCE:
        if paying:
            return (f"{name} reopened on {', '.join(paying)}: without integer dot products it was not proposed, but a vendor "
                    f"INT8 default ran up to {ratio_text(best)} the best FP32 ({fp32_on}), so Kiln's recipes are tried there")
        if best is None:
            return f"{name} not searched: no integer dot products, and no vendor INT8 default could be measured"
        return (f"{name} not searched: no integer dot products, and the vendor INT8 defaults confirm it: "
                f"{ratio_text(best)} the best FP32 ({fp32_on}), within noise or slower")
    if paying:
        dropped = [backend for backend in speedup if backend not in paying]
        elsewhere = f"; not on {', '.join(dropped)}, where it is not searched further" if dropped else ""
        return f"{name} pays on {', '.join(paying)}: up to {ratio_text(best)} the best FP32 on {fp32_on}{elsewhere}"
    if best is None:
        return f"{name} could not be measured on this device; not searched further"
    return (f"{name} does not pay on this device: {ratio_text(best)} the best FP32 "
            f"({fp32_on}), within noise or slower; not calibrated further")


def compile_winners(measured: list[dict[str, Any]]) -> list[str]:
    """One line per backend where compile options were tried: the best of them against its base build, and whether it won."""
    return [outcome["text"] for outcome in compile_outcomes(measured)]


def compile_outcomes(measured: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per backend where compile options were tried: the fastest passing tuned build against its base build with runtime
    defaults (`{"backend", "tuned": key, "base": key, "comparison": LatencyRatio.as_dict(), "text"}`)."""
    outcomes = []
    for backend in sorted({entry.get("backend") for entry in measured if entry.get("compile")}):
        tuned = [entry for entry in measured if entry.get("backend") == backend and entry.get("compile")
                 and entry_p50(entry) is not None and entry_passes(entry)]
        if not tuned:
            continue
        best = min(tuned, key=entry_p50)
        base_key = best["key"].split(COMPILE_SEPARATOR)[0]
        base = measured_on(measured, base_key, backend)
        if base is None or entry_p50(base) is None:
            continue
        ratio = entry_ratio(best, base)
        verdict = "won" if ratio.comparison == FASTER else "did not pay (within noise or slower)"
        text = f"{backend}: {describe_compile_options(best['compile'])} {verdict}: {ratio_text(ratio.ratio)} {base_key} with runtime defaults"
        outcomes.append({"backend": backend, "tuned": best["key"], "base": base_key, "comparison": ratio.as_dict(), "text": text})
    return outcomes
