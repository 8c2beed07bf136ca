"""What a variant runs in, and its name: the effective precision first, the recipe and compile options after it.

A build's precision says how its weights were stored (`fp32`, `int8`, …); what the device computes in
also depends on the compile options (OpenVINO's `inference_precision: bf16` runs an FP32 graph in
bfloat16) and on what the recipe left in float. The report, the search's families, the CLI, the
package README and the performance database all name a variant by `effective_precision`, so an
FP32 build that runs in bf16 is never called FP32. A quantized model on OpenVINO compiles without a
precision hint: its quantized operations run in INT8 and its float remainder in the CPU's default
(bf16 where it has bf16 units); the label names the INT8, and the device's measurement says what the
remainder ran in (`float_precision`, from the compiled model). Pure; the agent, the workers and the server import it.
"""
from __future__ import annotations

from typing import Any

# What a variant can run in, in the order a reader ranks them (most precise first).
EFFECTIVE_PRECISIONS = ("fp32", "bf16", "fp16", "int8", "int4 weights", "mixed")
FAMILY_TITLES = {"fp32": "FP32", "bf16": "BF16", "fp16": "FP16", "int8": "INT8", "int4 weights": "INT4 weights", "mixed": "Mixed"}
# OpenVINO's inference precision hint, as the compile options spell it, to what the CPU then computes in.
_HINTS = {"bf16": "bf16", "f16": "fp16", "fp16": "fp16"}
# Compile options a backend acts on; anything else it ignores (and the search must not propose it there).
BACKEND_OPTIONS = {
    "onnxruntime": frozenset({"static_shapes", "threads", "graph_optimization"}),
    "openvino": frozenset({"static_shapes", "threads", "performance_hint", "inference_precision"}),
}
_COMPILE_SEPARATOR = "+"


def ignored_options(backend: str, compile_options: dict[str, Any] | None) -> list[str]:
    """The compile options `backend` does not act on (ONNX Runtime's CPU provider has no bf16 hint, OpenVINO no ORT level)."""
    known = BACKEND_OPTIONS.get(backend)
    if known is None:
        return []
    return sorted(key for key in (compile_options or {}) if key not in known)


def effective_precision(precision: str, compile_options: dict[str, Any] | None = None, backend: str | None = None,
                        options: dict[str, Any] | None = None) -> str:
    """What the device computes in: fp32, bf16, fp16, int8, int4 weights or mixed.

    An FP32 or FP16 build under a bf16/f16 inference hint runs in that precision (on a backend that acts on
    the hint); INT8 with nodes kept in float, or INT4 with some weights in INT8, is mixed.
    """
    compile_options = compile_options or {}
    options = options or {}
    family = str(precision or "fp32").split("-")[0]
    hint = _HINTS.get(str(compile_options.get("inference_precision") or "").lower())
    acts_on_hint = backend is None or "inference_precision" not in ignored_options(backend, compile_options)
    if family in ("fp32", "fp16"):
        return hint if hint and acts_on_hint else family
    if family == "int4":
        return "mixed" if options.get("int8_nodes") or _fraction(options.get("ratio")) < 1.0 else "int4 weights"
    if family == "int8":
        return "mixed" if options.get("nodes_to_exclude") else "int8"
    return family


def _fraction(value: Any) -> float:
    try:
        return float(value) if value is not None else 1.0
    except (TypeError, ValueError):
        return 1.0


def variant_label(*, key: str | None, precision: str, backend: str, compile_options: dict[str, Any] | None = None,
                  options: dict[str, Any] | None = None) -> str:
    """The name a user reads: "bf16 · fp32+static+ov-bf16 on openvino", "int8 · int8-mse on onnxruntime", "fp32 +threads2 on onnxruntime".

    The effective precision leads; the recipe key follows when it says more than the precision, and
    compile options (the key's `+tags`) close it.
    """
    effective = effective_precision(precision, compile_options, backend, options)
    key = key or precision
    base, _, tags = key.partition(_COMPILE_SEPARATOR)
    if base == effective:
        name = effective + "".join(f" +{tag}" for tag in tags.split(_COMPILE_SEPARATOR) if tag)
    else:
        name = f"{effective} · {key}"
    return f"{name} on {backend}"


def family_title(effective: str) -> str:
    """"INT8", "BF16", "INT4 weights": how a family is headed in the report."""
    return FAMILY_TITLES.get(effective, effective.upper())
