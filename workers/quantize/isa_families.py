"""Which precision families a CPU's ISA makes worth searching, and why: the one owner of the chip → families decision.

The flags are the agent's (`devices.agent.capabilities`: /proc/cpuinfo's x86 "flags", Arm's "Features" or HWCAP).

- INT8 beats FP32 on a CPU when it has integer dot products. x86 VNNI and AMX-INT8 multiply u8×s8
  and accumulate in one instruction without saturation, so both ONNX Runtime schemes are probed
  (u8 activations, U8S8, and s8 activations, S8S8) and the faster one wins on the device. Arm's
  dot-product (asimddp) and matrix (i8mm) instructions take s8 activations (S8S8). Without them
  (AVX2 saturating in vpmaddubsw, NEON without sdot) INT8 rarely beats FP32: Kiln's own INT8
  recipes are not proposed in round 1, only the vendor defaults are measured, and where one of
  them beats FP32 beyond noise the family is searched after all (`workers.quantize.search`).
- BF16 is a family of its own on x86 bf16 units (avx512_bf16, AMX-BF16): OpenVINO's bf16
  inference precision on the FP32 graph. OpenVINO's CPU plugin acts on it only there, so Arm's
  bf16 (BFMMLA) is reported but not tried.
- FP16 builds are tried only with native FP16 arithmetic (avx512_fp16, AMX-FP16, Arm fphp/asimdhp);
  elsewhere an FP16 model only converts back and forth.

Each reason starts with the family and a colon ("INT8: ..."), unlike the measured verdicts ("INT8 pays on ...").
Pure: flags in, `FamilyChoice`s out; nothing here measures.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# Integer dot products, as the agent spells them ("amx" is the agent's summary of any AMX flag).
X86_INT8_DOT = ("avx512_vnni", "avx_vnni", "avxvnni", "avx_vnni_int8", "amx_int8", "amx_tile", "amx")
ARM_INT8_DOT = ("asimddp", "dotprod", "i8mm", "svei8mm")
# Arm without dot products still runs ONNX Runtime's signed NEON kernels (the S8S8 scheme, `schemes.ort_int8_scheme`).
ARM_SIMD = ("asimd", "neon", "sve")
X86_BF16 = ("avx512_bf16", "amx_bf16")
ARM_BF16 = ("bf16", "svebf16")
NATIVE_FP16 = ("avx512_fp16", "amx_fp16", "asimdhp", "fphp")
# Every flag the decision reads: the agent must report each of them (tests/devices/test_capabilities.py).
DECISION_FLAGS = (*X86_INT8_DOT, *ARM_INT8_DOT, *ARM_SIMD, *X86_BF16, *ARM_BF16, *NATIVE_FP16)
# Spellings other tools use for a flag the agent reports under another name (never reported by the agent itself).
ALIASES = ("avxvnni", "dotprod", "neon")

U8, S8 = "uint8", "int8"
NO_FLAGS = "the device reported no ISA flags"


@dataclass(frozen=True)
class FamilyChoice:
    """Whether round 1 proposes a family on this CPU, why (a sentence for the user), and for INT8 the activation types."""

    family: str
    proposed: bool
    reason: str
    activations: tuple[str, ...] = ()


def _present(isa: Iterable[str], names: tuple[str, ...]) -> list[str]:
    flags = {flag.lower() for flag in isa}
    return [name for name in names if name in flags]


def int8_dot_products(isa: Iterable[str]) -> list[str]:
    """The integer dot-product flags of `isa` (x86 VNNI/AMX first, then Arm's)."""
    flags = list(isa)
    return _present(flags, X86_INT8_DOT) + _present(flags, ARM_INT8_DOT)


def int8_choice(isa: Iterable[str]) -> FamilyChoice:
    flags = list(isa)
    if not flags:
        # An agent that reported no flags (or none known yet) is no evidence of a chip without dot products.
        return FamilyChoice("int8", True, f"INT8: {NO_FLAGS}: Kiln's INT8 recipes proposed, the measurements decide")
    x86, arm = _present(flags, X86_INT8_DOT), _present(flags, ARM_INT8_DOT)
    if x86:
        return FamilyChoice("int8", True, f"INT8: VNNI/AMX ({', '.join(x86)}) multiplies u8×s8 without saturation: "
                                          "u8 and s8 activations both tried, the faster kept", (U8, S8))
    if arm:
        return FamilyChoice("int8", True, f"INT8: Arm integer dot products ({', '.join(arm)}): s8 activations (S8S8), "
                                          "as ONNX Runtime's Arm kernels take them", (S8,))
    return FamilyChoice("int8", False, "INT8: pruned, no integer dot-product instructions (no VNNI/AMX, no Arm dotprod): "
                                       "INT8 rarely beats FP32 here; only the vendor defaults are measured to confirm, "
                                       "and INT8 is searched further only where one of them beats FP32")


def bf16_choice(isa: Iterable[str]) -> FamilyChoice:
    flags = list(isa)
    if not flags:
        return FamilyChoice("bf16", False, f"BF16: {NO_FLAGS}: skipped")
    x86, arm = _present(flags, X86_BF16), _present(flags, ARM_BF16)
    if x86:
        return FamilyChoice("bf16", True, f"BF16: {', '.join(x86)} present: OpenVINO's bf16 inference precision "
                                          "tried as its own family")
    if arm:
        return FamilyChoice("bf16", False, f"BF16: Arm {', '.join(arm)} present, but OpenVINO's bf16 inference precision "
                                           "runs on x86 bf16 units only: skipped")
    return FamilyChoice("bf16", False, "BF16: no bf16 units (avx512_bf16, AMX-BF16): skipped")


def fp16_choice(isa: Iterable[str]) -> FamilyChoice:
    flags = list(isa)
    if not flags:
        return FamilyChoice("fp16", False, f"FP16: {NO_FLAGS}: skipped")
    native = _present(flags, NATIVE_FP16)
    if native:
        return FamilyChoice("fp16", True, f"FP16: native FP16 arithmetic ({', '.join(native)}): FP16 builds tried")
    return FamilyChoice("fp16", False, "FP16: no native FP16 arithmetic: skipped")


def isa_families(isa: Iterable[str]) -> dict[str, FamilyChoice]:
    """Per family ("int8", "bf16", "fp16"): whether round 1 proposes it on a CPU with these flags, and why."""
    flags = list(isa)
    return {choice.family: choice for choice in (int8_choice(flags), bf16_choice(flags), fp16_choice(flags))}


def isa_notes(isa: Iterable[str]) -> list[str]:
    """The reasons of `isa_families`, one sentence per family, for the job's events and the report's search notes."""
    return [choice.reason for choice in isa_families(isa).values()]
