"""What the auto search says about the families it measured: which pay, on which runtime, and which compile options won.

The planner (workers.quantize.search) acts on these verdicts, and the report (kiln.reports.selectors) prints
their reasons as the search card's notes, so both say the same thing about the same measurements.
"""

from __future__ import annotations

import math
from typing import Any

from devices.backends.options import describe as describe_compile_options
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
    entry_p50,
    entry_passes,
    is_vendor_default,
    measured_on,
)
from workers.quantize.isa_families import int8_choice
from workers.quantize.runtimes import ONNX_RUNTIMES

# Below this relative gap two latencies are a tie, whatever their spread says.
NOISE_FLOOR = 0.03


def relative_noise(*entries: dict[str, Any]) -> float:
    """How far apart two p50s must be to differ: twice the combined standard error of the medians, at least NOISE_FLOOR."""
    variance = 0.0
    for entry in entries:
        latency = entry.get("latency_ms") or {}
        count = max(int(latency.get("count") or 1), 1)
        variance += (float(latency.get("cv") or 0.0) ** 2) * (math.pi / 2) / count
    return max(NOISE_FLOOR, 2.0 * math.sqrt(variance))




def family_verdicts(measured: list[dict[str, Any]], *, isa: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Per family (by precision): its probe's speed-up over the device's best FP32, per backend, and whether it pays.

    `{precision: {"family", "probe", "evidence", "speedup": {backend: x}, "fastest": {backend: key}, "paying_backends",
    "reason"}}`; a family whose probe failed to build or measure pays nowhere. INT8 is judged per runtime on that runtime's
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
        speedup, fastest, paying = _speedups(entries, best_fp32)
        name = FAMILY_NAMES[precision]
        reason = _verdict_reason(name, evidence, speedup, paying, best_fp32) + _per_backend(speedup, fastest)
        verdicts[precision] = {"family": name, "probe": probe, "evidence": evidence, "speedup": speedup, "fastest": fastest,
                               "paying_backends": paying, "reason": reason}
    return verdicts


def ranking_pays(verdicts: dict[str, dict[str, Any]]) -> bool:
    """Whether ranking nodes by sensitivity can guide anything: it chooses the nodes Kiln's INT8 refinements keep in float,
    so it pays once INT8 paid on a runtime where Kiln refines it (ONNX Runtime's QDQ, OpenVINO's NNCF IR; not LiteRT)
    or INT8-dynamic paid."""
    readers = {"int8": KEEP_FLOAT_RUNTIMES, "int8-dynamic": ONNX_RUNTIMES}
    return any(set(verdicts.get(precision, {}).get("paying_backends") or []) & set(backends) for precision, backends in readers.items())


def _speedups(entries: list[dict[str, Any]], best_fp32: dict[str, Any]) -> tuple[dict[str, float], dict[str, str], list[str]]:
    """Per backend, the fastest entry's speed-up over the best FP32 and its key, and the backends where it is beyond noise."""
    fastest: dict[str, dict[str, Any]] = {}
    for entry in entries:
        backend = entry.get("backend")
        if entry_p50(entry) is not None and (backend not in fastest or entry_p50(entry) < entry_p50(fastest[backend])):
            fastest[backend] = entry
    speedup: dict[str, float] = {}
    paying: list[str] = []
    for backend in sorted(fastest, key=str):
        entry = fastest[backend]
        speedup[backend] = entry_p50(best_fp32) / entry_p50(entry)
        if speedup[backend] > 1.0 + relative_noise(entry, best_fp32):
            paying.append(backend)
    return speedup, {backend: fastest[backend].get("key", "") for backend in speedup}, paying


def _per_backend(speedup: dict[str, float], fastest: dict[str, str]) -> str:
    """Each runtime's own figure, where the family was measured on more than one ("onnxruntime int8-minmax 0.99x")."""
    if len(speedup) < 2:
        return ""
    return " (" + "; ".join(f"{backend} {fastest[backend]} {speedup[backend]:.2f}x" for backend in speedup) + ")"


def _verdict_reason(name: str, evidence: str, speedup: dict[str, float], paying: list[str], best_fp32: dict[str, Any]) -> str:
    best = max(speedup.values()) if speedup else None
    fp32_on = best_fp32.get("backend")
    if evidence == VENDOR_EVIDENCE:
        if paying:
            return (f"{name} reopened on {', '.join(paying)}: without integer dot products it was not proposed, but a vendor "
                    f"INT8 default ran up to {best:.2f}x the best FP32 ({fp32_on}), so Kiln's recipes are tried there")
        if best is None:
            return f"{name} not searched: no integer dot products, and no vendor INT8 default could be measured"
        return (f"{name} not searched: no integer dot products, and the vendor INT8 defaults confirm it: "
                f"{best:.2f}x the best FP32 ({fp32_on}), within noise or slower")
    if paying:
        dropped = [backend for backend in speedup if backend not in paying]
        elsewhere = f"; not on {', '.join(dropped)}, where it is not searched further" if dropped else ""
        return f"{name} pays on {', '.join(paying)}: up to {best:.2f}x the best FP32 on {fp32_on}{elsewhere}"
    if best is None:
        return f"{name} could not be measured on this device; not searched further"
    return (f"{name} does not pay on this device: {best:.2f}x the best FP32 "
            f"({fp32_on}), within noise or slower; not calibrated further")


def compile_winners(measured: list[dict[str, Any]]) -> list[str]:
    """One line per backend where a compile option beat its base build: which options, how much faster."""
    lines = []
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
        ratio = entry_p50(base) / entry_p50(best)
        verdict = "won" if ratio > 1.0 + relative_noise(best, base) else "did not pay (within noise or slower)"
        lines.append(f"{backend}: {describe_compile_options(best['compile'])} {verdict}: {ratio:.2f}x {base_key} with runtime defaults")
    return lines
