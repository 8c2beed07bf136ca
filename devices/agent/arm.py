"""What an Arm machine tells a scheduler: the ISA extensions the kernel grants this process (HWCAP), the core by
name (MIDR implementer and part), the board, and whether a user-mode emulator is running the process instead.

HWCAP is the kernel's own answer (`getauxval(AT_HWCAP)`): what this process may execute, which is also what an
emulator emulates. /proc/cpuinfo's `Features` line says the same on real hardware and is read when HWCAP is not.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
from pathlib import Path

AT_HWCAP, AT_HWCAP2 = 16, 26

# Bit -> /proc/cpuinfo name, from the kernel's arch/arm64/include/uapi/asm/hwcap.h (only the ones worth scheduling on).
HWCAP_BITS = {0: "fp", 1: "asimd", 9: "fphp", 10: "asimdhp", 20: "asimddp", 22: "sve", 23: "asimdfhm"}
HWCAP2_BITS = {1: "sve2", 9: "svei8mm", 12: "svebf16", 13: "i8mm", 14: "bf16", 23: "sme"}

ARM_MACHINES = ("aarch64", "arm64", "armv8l", "armv7l")

# MIDR implementer -> vendor, and (implementer, part) -> core, for the cores Kiln's users deploy to.
IMPLEMENTERS = {0x41: "Arm", 0x42: "Broadcom", 0x46: "Fujitsu", 0x48: "HiSilicon", 0x4E: "NVIDIA", 0x51: "Qualcomm", 0x61: "Apple",
                0xC0: "Ampere"}
PARTS = {
    (0x41, 0xD03): "Cortex-A53", (0x41, 0xD04): "Cortex-A35", (0x41, 0xD05): "Cortex-A55", (0x41, 0xD07): "Cortex-A57",
    (0x41, 0xD08): "Cortex-A72", (0x41, 0xD09): "Cortex-A73", (0x41, 0xD0A): "Cortex-A75", (0x41, 0xD0B): "Cortex-A76",
    (0x41, 0xD0C): "Neoverse-N1", (0x41, 0xD0D): "Cortex-A77", (0x41, 0xD40): "Neoverse-V1", (0x41, 0xD41): "Cortex-A78",
    (0x41, 0xD42): "Cortex-A78AE", (0x41, 0xD44): "Cortex-X1", (0x41, 0xD46): "Cortex-A510", (0x41, 0xD47): "Cortex-A710",
    (0x41, 0xD48): "Cortex-X2", (0x41, 0xD49): "Neoverse-N2", (0x41, 0xD4B): "Cortex-A78C", (0x41, 0xD4D): "Cortex-A715",
    (0x41, 0xD4F): "Neoverse-V2", (0x41, 0xD80): "Cortex-A520", (0x41, 0xD81): "Cortex-A720", (0x41, 0xD8E): "Neoverse-N3",
    (0x46, 0x001): "A64FX", (0x48, 0xD01): "Kunpeng 920", (0x4E, 0x004): "Carmel", (0xC0, 0xAC3): "AmpereOne",
}


def is_arm(machine: str | None = None) -> bool:
    return (machine or platform.machine()).lower() in ARM_MACHINES


def decode_hwcaps(hwcap: int, hwcap2: int) -> list[str]:
    """The feature names (as /proc/cpuinfo spells them) set in the two HWCAP words."""
    names = [name for bit, name in HWCAP_BITS.items() if hwcap >> bit & 1]
    return names + [name for bit, name in HWCAP2_BITS.items() if hwcap2 >> bit & 1]


def hwcap_features() -> list[str] | None:
    """This process's Arm ISA features from the kernel's auxiliary vector, or None off Arm Linux (or without getauxval)."""
    if not is_arm() or platform.system() != "Linux":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        getauxval = libc.getauxval
    except (OSError, AttributeError):
        return None
    getauxval.restype, getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
    return decode_hwcaps(int(getauxval(AT_HWCAP)), int(getauxval(AT_HWCAP2)))


def core_name(cpuinfo: str) -> str | None:
    """"Arm Neoverse-N1" from the first core's `CPU implementer` and `CPU part` lines, or None when they are absent."""
    fields: dict[str, int] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("cpu implementer", "cpu part") and key not in fields:
            try:
                fields[key] = int(value.strip(), 16)
            except ValueError:
                return None
    if len(fields) < 2:
        return None
    implementer, part = fields["cpu implementer"], fields["cpu part"]
    vendor = IMPLEMENTERS.get(implementer, f"implementer {implementer:#x}")
    core = PARTS.get((implementer, part), f"part {part:#x}")
    return f"{vendor} {core}"


def board_model() -> str | None:
    """The board's name from the device tree ("Raspberry Pi 5 Model B Rev 1.0", a Jetson's), where the firmware gives one."""
    try:
        return Path("/proc/device-tree/model").read_bytes().rstrip(b"\0").decode("utf-8", "replace").strip() or None
    except OSError:
        return None


# -- emulation ------------------------------------------------------------------------------------

def _family(machine: str) -> str | None:
    machine = machine.lower()
    if machine in ARM_MACHINES:
        return "arm"
    if machine in ("x86_64", "amd64", "i386", "i686", "x86"):
        return "x86"
    return None


def kernel_cpu_family(modalias: str | None = None) -> str | None:
    """The CPU family of the kernel itself, from /sys/devices/system/cpu/modalias (`cpu:type:x86,…` or
    `cpu:type:aarch64:…`). A user-mode emulator translates the process's syscalls but not this file."""
    if modalias is None:
        try:
            modalias = Path("/sys/devices/system/cpu/modalias").read_text()
        except OSError:
            return None
    if not modalias.startswith("cpu:type:"):
        return None
    kind = modalias[len("cpu:type:"):].split(",", 1)[0].split(":", 1)[0]
    return _family(kind)


def cpuinfo_family(cpuinfo: str) -> str | None:
    """x86 when /proc/cpuinfo describes an x86 CPU (a `vendor_id` line), arm when it has Arm's `CPU implementer`."""
    keys = {line.partition(":")[0].strip().lower() for line in cpuinfo.splitlines()}
    if "vendor_id" in keys:
        return "x86"
    if "cpu implementer" in keys:
        return "arm"
    return None


def binfmt_emulator(machine: str, root: Path = Path("/proc/sys/fs/binfmt_misc")) -> str | None:
    """The QEMU interpreter the kernel's binfmt_misc runs this machine's binaries through, when one is enabled.
    No native host registers a handler for its own architecture (it would capture every native program)."""
    entry = root / f"qemu-{machine}"
    try:
        text = entry.read_text()
    except OSError:
        return None
    if not text.startswith("enabled"):
        return None
    interpreter = next((line.split(None, 1)[1] for line in text.splitlines() if line.startswith("interpreter ")), "qemu")
    return interpreter.strip()


def emulation(machine: str | None = None, *, cpuinfo: str | None = None, modalias: str | None = None,
              binfmt_root: Path = Path("/proc/sys/fs/binfmt_misc")) -> str | None:
    """A sentence saying that (and how) this process runs under a user-mode emulator, or None when nothing tells.

    Timings taken under emulation measure the emulator on its host, not the device: the agent says so in its
    capabilities and with every result, and the report does not present them as the device's speed.
    """
    machine = (machine or platform.machine()).lower()
    family = _family(machine)
    if family is None:
        return None
    kernel = kernel_cpu_family(modalias)
    if kernel and kernel != family:
        return f"{machine} code on an {kernel} kernel: a user-mode emulator (QEMU) runs this agent, so its timings are the emulator's"
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    described = cpuinfo_family(cpuinfo)
    if described and described != family:
        return f"{machine} code while /proc/cpuinfo describes an {described} CPU: a user-mode emulator runs this agent, so its timings are the emulator's"
    interpreter = binfmt_emulator(machine, binfmt_root)
    if interpreter:
        return f"{machine} binaries run through {interpreter} on this host (binfmt_misc): its timings are the emulator's"
    return None
