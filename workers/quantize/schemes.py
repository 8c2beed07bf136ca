"""Which quantization scheme suits a device and a model: ORT integer types from ISA flags, transformer recipes."""

from __future__ import annotations

from typing import Any

from workers.quantize.isa_families import ARM_INT8_DOT, ARM_SIMD, X86_INT8_DOT

VNNI_FLAGS = set(X86_INT8_DOT)
ARM_FLAGS = set(ARM_SIMD) | set(ARM_INT8_DOT)
TRANSFORMER_OPS = {"LayerNormalization", "Softmax", "Attention", "MultiHeadAttention", "SkipLayerNormalization"}
# Ops the transformer recipe keeps in float: quantizing them costs accuracy and buys no speed on CPU.
TRANSFORMER_FLOAT_OPS = ("LayerNormalization", "Softmax", "SkipLayerNormalization", "Erf", "Gelu")
TRANSFORMER_INT8_OPS = ["MatMul", "Gemm", "Conv"]


def ort_int8_scheme(isa: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """ONNX Runtime CPU integer types for a device's ISA flags: U8S8, U8S8 with reduce_range, U8U8 or S8S8.

    Follows onnxruntime's own guidance: VNNI (or AMX) accumulates u8×s8 products without
    saturation; AVX2/AVX-512 without VNNI saturate in vpmaddubsw unless weights use 7 bits
    (reduce_range); without AVX2 the U8U8 kernels are the safe path; ARM prefers signed activations.
    """
    flags = {flag.lower() for flag in isa}
    if flags & VNNI_FLAGS:
        return {"name": "U8S8", "activation_type": "uint8", "weight_type": "int8", "reduce_range": False,
                "reason": "VNNI/AMX present: u8×s8 dot products accumulate without saturation"}
    if flags & ARM_FLAGS:
        return {"name": "S8S8", "activation_type": "int8", "weight_type": "int8", "reduce_range": False,
                "reason": "ARM: signed 8-bit activations suit the NEON/dot-product kernels"}
    if flags & {"avx2", "avx512f", "avx512bw"}:
        return {"name": "U8S8-reduce-range", "activation_type": "uint8", "weight_type": "int8", "reduce_range": True,
                "reason": "AVX2/AVX-512 without VNNI: 7-bit weights avoid vpmaddubsw saturation"}
    return {"name": "U8U8", "activation_type": "uint8", "weight_type": "uint8", "reduce_range": False,
            "reason": "no AVX2: the U8U8 kernels avoid u8×s8 saturation on SSE"}


def build_options(scheme: dict[str, Any]) -> dict[str, Any]:
    """The build options that give an ONNX Runtime INT8 variant a scheme's integer types."""
    return {"activation_type": scheme["activation_type"], "weight_type": scheme["weight_type"], "reduce_range": scheme["reduce_range"]}


def is_transformer(op_histogram: dict[str, int]) -> bool:
    """Whether a model looks like a transformer (attention softmax or layer norms)."""
    return any(op in op_histogram for op in TRANSFORMER_OPS)

