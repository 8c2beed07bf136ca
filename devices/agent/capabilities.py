"""What this machine offers: OS, CPU and its ISA extensions, memory, GPU, runtimes."""

from __future__ import annotations

import logging
import platform
import shutil
import subprocess

import psutil

from devices.agent import AGENT_VERSION, arm
from devices.backends.registry import available_backends
from devices.cpus import usable_cores

logger = logging.getLogger(__name__)

# /proc/cpuinfo flags worth a scheduler's attention (x86 "flags" and Arm "Features"/HWCAP spellings): among them every
# flag the search's chip → families decision reads (workers.quantize.isa_families): integer dot products (VNNI, AMX-INT8,
# Arm dotprod/i8mm), bf16 units and native FP16 arithmetic.
INTERESTING_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx_vnni_int8",
    "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_bf16", "amx_int8", "amx_fp16",
    "asimd", "fphp", "asimdhp", "asimddp", "asimdfhm", "sve", "sve2", "i8mm", "svei8mm", "bf16", "svebf16", "sme",
)


def parse_cpuinfo(text: str) -> tuple[str | None, list[str]]:
    """CPU model name and the interesting ISA flags (plus "amx" when any AMX flag is present)
    from the text of /proc/cpuinfo."""
    model, flags = None, set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "hardware", "cpu model") and not model:
            model = value.strip() or None
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    isa = [flag for flag in INTERESTING_FLAGS if flag in flags]
    if any(flag.startswith("amx") for flag in flags):
        isa.append("amx")
    return model, isa


def cpu_isa() -> list[str]:
    """This CPU's interesting ISA flags, as the agent reports them."""
    return _cpu()[1]


def _cpu() -> tuple[str | None, list[str]]:
    try:
        with open("/proc/cpuinfo", errors="replace") as handle:
            text = handle.read()
    except OSError:
        text = ""
    model, isa = parse_cpuinfo(text)
    if arm.is_arm():
        # The kernel's HWCAP words are what this process may execute (an emulator's CPU under emulation);
        # Arm's /proc/cpuinfo has no "model name", but names the core by implementer and part.
        granted = set(arm.hwcap_features() or [])
        isa = [flag for flag in INTERESTING_FLAGS if flag in granted or flag in isa]
        model = model or arm.core_name(text) or arm.board_model()
    return model or platform.processor() or None, isa


def detect_gpu() -> dict | None:
    """NVIDIA GPUs as reported by nvidia-smi, or None when there is none (or no nvidia-smi)."""
    nvidia_smi = shutil.which("nvidia-smi")
    if not nvidia_smi:
        return None
    try:
        completed = subprocess.run(
            [nvidia_smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("nvidia-smi failed: %s", exc)
        return None
    devices = []
    for line in completed.stdout.strip().splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) < 3:
            continue
        name, memory, driver = parts[:3]
        devices.append({
            "name": name,
            "memory_mb": int(float(memory)) if memory.replace(".", "", 1).isdigit() else None,
            "driver_version": driver,
        })
    if not devices:
        return None
    return {"vendor": "nvidia", "count": len(devices), "devices": devices, "name": devices[0]["name"]}


def runtime_versions() -> dict[str, str]:
    """Each backend this agent offers, with its version."""
    return {name: backend.version() or "unknown" for name, backend in available_backends().items()}


def collect_capabilities() -> dict:
    """The capabilities object of the agent protocol."""
    cpu_model, isa = _cpu()
    cores, logical_cores = usable_cores()
    return {
        "os": platform.system().lower(),
        "os_release": platform.release(),
        "arch": platform.machine().lower(),
        "cpu_model": cpu_model,
        "cores": cores,
        "logical_cores": logical_cores,
        "isa": isa,
        "memory_mb": psutil.virtual_memory().total // (1024 * 1024),
        "gpu": detect_gpu(),
        "runtimes": runtime_versions(),
        "agent_version": AGENT_VERSION,
        "python": platform.python_version(),
        "board": arm.board_model() if arm.is_arm() else None,
        # A sentence when a user-mode emulator runs this agent (QEMU on another architecture), else None.
        "emulated": arm.emulation(),
    }
