"""The families the auto search knows, as facts the planner, its verdicts and the local search share.

Round 1 measures each family's cheapest member (its probe) beside the vendor defaults; the verdicts
(workers.quantize.verdicts) judge each family by its probe, and the planner (workers.quantize.search)
proposes the rest of a family where it paid. A measured entry is read here too, the one way all three do.
"""

from __future__ import annotations

from typing import Any

from workers.quantize import litert_family, openvino_family
from workers.quantize.runtimes import ONNX_READERS

# The cheapest member of each family: what round 1 measures for speed before any accuracy work.
PROBES = {"int8": "int8-minmax", "int8-dynamic": "int8-dynamic", "int4-weight": "int4-rtn", "fp16": "fp16", "bf16": "bf16"}
# Where VNNI/AMX make both ONNX Runtime schemes worth timing, the INT8 probe has a twin with s8 activations (S8S8);
# the family's verdict takes the faster of the two.
S8_PROBE = "int8-minmax-s8"
PROBE_CHOICES = {**{precision: (probe,) for precision, probe in PROBES.items()}, "int8": (PROBES["int8"], S8_PROBE)}
# The families that need integer dot products to pay (`isa_families.int8_choice`); where the ISA has none, their verdict
# rests on the vendor INT8 defaults' evidence instead of their probe's (`family_verdicts`).
INT8_FAMILIES = ("int8", "int8-dynamic")
# Where Kiln's INT8 refinements keep the most sensitive nodes in float: its QDQ files on ONNX Runtime, NNCF's IR on OpenVINO.
KEEP_FLOAT_RUNTIMES = (*ONNX_READERS["int8"], openvino_family.RUNTIME)
# A runtime's own INT8 build (NNCF's OpenVINO IR, LiteRT's full-integer model) is the INT8 family on that runtime: Kiln's
# QDQ probe runs on ONNX Runtime alone, so OpenVINO's and LiteRT's INT8 are judged by what they run, not by ORT's probe.
NATIVE_INT8_KEYS = (openvino_family.DEFAULT_KEY, openvino_family.TRANSFORMER_KEY, litert_family.KEYS["int8"])
PROBE_EVIDENCE, VENDOR_EVIDENCE = "probe", "vendor defaults"
# bf16 is a family of its own: the FP32 graph under OpenVINO's bf16 inference precision, where the CPU has bf16 units.
# Its members are FP32 builds whose compile options define the family; ONNX Runtime's CPU provider has no such mode.
BF16_KEY = "bf16"
FAMILY_COMPILE = {BF16_KEY: {"inference_precision": "bf16"}}
# A quantized OpenVINO model's float remainder in f32, where the CPU's default for it is bf16: a compile option of the
# search, and a refinement of an INT8 build that misses (workers.quantize.search `_f32_remainder`).
F32_REMAINDER_TAG = "ov-f32"
F32_REMAINDER = {"inference_precision": "f32"}


def is_f32_remainder(spec: dict[str, Any]) -> bool:
    """A quantized build compiled with its float remainder in f32."""
    return (spec.get("compile") or {}).get("inference_precision") == F32_REMAINDER["inference_precision"] \
        and spec.get("precision") not in (None, "fp32")
# What a user gets without Kiln: onnxruntime's quantize_static and nncf.quantize called with their
# defaults (FP32 with runtime defaults is the "fp32" spec on every backend). They are measured in
# round 1 whatever the probes say, and re-timed beside the leader at the end, so Kiln's pick is
# never slower than a vendor default that meets the same tolerance.
VENDOR_DEFAULTS = ("fp32", "int8-ort-default", "int8-nncf", openvino_family.DEFAULT_KEY)
FAMILY_NAMES = {"int8": "INT8", "int8-dynamic": "INT8-dynamic", "int4-weight": "INT4 weights", "fp16": "FP16", "bf16": "BF16"}
COMPILE_SEPARATOR = "+"


def is_vendor_default(entry: dict[str, Any]) -> bool:
    """Whether a measured entry is a configuration a user gets without Kiln (VENDOR_DEFAULTS, runtime defaults)."""
    return entry.get("key") in VENDOR_DEFAULTS and not entry.get("compile")


