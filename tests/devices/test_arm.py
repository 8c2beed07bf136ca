"""Arm facts of the agent's capabilities: HWCAP decoding, the core by name, and telling emulation apart from hardware."""
from __future__ import annotations

from devices.agent import arm
from devices.agent.capabilities import collect_capabilities

NEOVERSE_CPUINFO = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1
"""
X86_CPUINFO = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse4_2 avx2\n"


def test_hwcap_words_decode_to_the_feature_names_cpuinfo_uses():
    # QEMU's `max` CPU, as an emulated aarch64 process reads them from getauxval.
    names = arm.decode_hwcaps(0xECFFFFFB, 0x7F877FFF)
    assert {"fp", "asimd", "asimdhp", "asimddp", "sve", "sve2", "i8mm", "bf16"} <= set(names)
    # A Cortex-A72 (Raspberry Pi 4): Armv8.0, no dot product, no SVE, no i8mm.
    assert arm.decode_hwcaps(0b11, 0) == ["fp", "asimd"]


def test_the_core_is_named_from_implementer_and_part():
    assert arm.core_name(NEOVERSE_CPUINFO) == "Arm Neoverse-N1"
    assert arm.core_name("CPU implementer\t: 0x41\nCPU part\t: 0xd0b\n") == "Arm Cortex-A76"
    assert arm.core_name("CPU implementer\t: 0x99\nCPU part\t: 0x123\n") == "implementer 0x99 part 0x123"
    assert arm.core_name(X86_CPUINFO) is None


def test_an_aarch64_process_on_an_x86_kernel_says_it_is_emulated():
    said = arm.emulation("aarch64", cpuinfo=NEOVERSE_CPUINFO, modalias="cpu:type:x86,ven0002fam0019mod0011:feature:,0000")
    assert said and "on an x86 kernel" in said and "emulator" in said


def test_an_emulator_that_shows_the_hosts_cpuinfo_is_caught_too():
    said = arm.emulation("aarch64", cpuinfo=X86_CPUINFO, modalias="")
    assert said and "describes an x86 CPU" in said


def test_a_binfmt_handler_for_the_own_architecture_means_emulation(tmp_path):
    (tmp_path / "qemu-aarch64").write_text("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: POCF\n")
    said = arm.emulation("aarch64", cpuinfo=NEOVERSE_CPUINFO, modalias="cpu:type:aarch64:feature:,0000,0001", binfmt_root=tmp_path)
    assert said and "aarch64-binfmt-P" in said
    (tmp_path / "qemu-aarch64").write_text("disabled\n")
    assert arm.emulation("aarch64", cpuinfo=NEOVERSE_CPUINFO, modalias="cpu:type:aarch64:feature:,0000", binfmt_root=tmp_path) is None


def test_native_hardware_is_not_called_emulated(tmp_path):
    assert arm.emulation("aarch64", cpuinfo=NEOVERSE_CPUINFO, modalias="cpu:type:aarch64:feature:,0000", binfmt_root=tmp_path) is None
    assert arm.emulation("x86_64", cpuinfo=X86_CPUINFO, modalias="cpu:type:x86,ven0002", binfmt_root=tmp_path) is None


def test_this_x86_agent_reports_no_emulation(monkeypatch):
    monkeypatch.setenv("KILN_AGENT_BACKENDS", "onnxruntime")
    capabilities = collect_capabilities()
    assert capabilities["emulated"] is None
    assert capabilities["board"] is None or capabilities["arch"] in arm.ARM_MACHINES
