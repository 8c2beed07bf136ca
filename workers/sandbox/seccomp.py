"""A seccomp filter that takes from this process the system calls a model never needs.

Sockets, new namespaces, mounts, tracing other processes, kernel keyrings, BPF, io_uring (whose
operations would bypass the filter), module loading and running other programs all fail with EPERM
(clone3 with ENOSYS, so that the C library falls back to clone, whose namespace flags the filter can
read). The filter is classic BPF built here, so no libseccomp is needed; x86-64 and AArch64 have tables.
"""
from __future__ import annotations

import ctypes
import errno
import platform

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_SYSCALL_BIT = 0x40000000

# Names shared by both tables; each architecture gives its own numbers.
DENIED = (
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4", "sendto", "sendmsg",
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_open", "pidfd_getfd",
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "move_mount", "open_tree", "fsopen", "fsmount",
    "fsconfig", "fspick", "mount_setattr", "open_by_handle_at", "name_to_handle_at", "quotactl", "quotactl_fd",
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd", "fanotify_init",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff",
    "syslog", "acct", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname",
    "execve", "execveat", "personality", "vhangup", "lookup_dcookie",
)
_X86_64 = {
    "socket": 41, "socketpair": 53, "connect": 42, "bind": 49, "listen": 50, "accept": 43, "accept4": 288, "sendto": 44,
    "sendmsg": 46, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312, "pidfd_open": 434,
    "pidfd_getfd": 438, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308,
    "move_mount": 429, "open_tree": 428, "fsopen": 430, "fsmount": 432, "fsconfig": 431, "fspick": 433, "mount_setattr": 442,
    "open_by_handle_at": 304, "name_to_handle_at": 303, "quotactl": 179, "quotactl_fd": 443, "keyctl": 250, "add_key": 248,
    "request_key": 249, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "fanotify_init": 300, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "kexec_load": 246, "kexec_file_load": 320, "init_module": 175,
    "finit_module": 313, "delete_module": 176, "reboot": 169, "swapon": 167, "swapoff": 168, "syslog": 103, "acct": 163,
    "settimeofday": 164, "clock_settime": 227, "clock_adjtime": 305, "adjtimex": 159, "sethostname": 170,
    "setdomainname": 171, "execve": 59, "execveat": 322, "personality": 135, "vhangup": 153, "lookup_dcookie": 212,
    # x86-only ways to reach hardware or old interfaces
    "iopl": 172, "ioperm": 173, "uselib": 134, "ustat": 136, "sysfs": 139, "_sysctl": 156, "create_module": 174,
    "get_kernel_syms": 177, "query_module": 178, "nfsservctl": 180,
    "clone": 56, "clone3": 435,
}
_AARCH64 = {
    "socket": 198, "socketpair": 199, "connect": 203, "bind": 200, "listen": 201, "accept": 202, "accept4": 242, "sendto": 206,
    "sendmsg": 211, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272, "pidfd_open": 434,
    "pidfd_getfd": 438, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "unshare": 97, "setns": 268,
    "move_mount": 429, "open_tree": 428, "fsopen": 430, "fsmount": 432, "fsconfig": 431, "fspick": 433, "mount_setattr": 442,
    "open_by_handle_at": 265, "name_to_handle_at": 264, "quotactl": 60, "quotactl_fd": 443, "keyctl": 219, "add_key": 217,
    "request_key": 218, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "fanotify_init": 262, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "kexec_load": 104, "kexec_file_load": 294, "init_module": 105,
    "finit_module": 273, "delete_module": 106, "reboot": 142, "swapon": 224, "swapoff": 225, "syslog": 116, "acct": 89,
    "settimeofday": 170, "clock_settime": 112, "clock_adjtime": 266, "adjtimex": 171, "sethostname": 161,
    "setdomainname": 162, "execve": 221, "execveat": 281, "personality": 92, "vhangup": 58, "lookup_dcookie": 18,
    "nfsservctl": 42,
    "clone": 220, "clone3": 435,
}
_TABLES = {"x86_64": _X86_64, "aarch64": _AARCH64}
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME
_CLONE_NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x00000080

_LD_ABS_W, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_KILL_PROCESS, _RET_ALLOW, _RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
_OFFSET_NR, _OFFSET_ARCH, _OFFSET_ARG0 = 0, 4, 16
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2


class _Instruction(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Instruction))]


def supported_architecture() -> str | None:
    machine = platform.machine().lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    return machine if machine in _TABLES else None


def build_filter(architecture: str) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions: wrong architecture kills, denied calls fail, the rest pass."""
    table = _TABLES[architecture]
    program = [(_LD_ABS_W, 0, 0, _OFFSET_ARCH), (_JEQ, 1, 0, _AUDIT_ARCH[architecture]), (_RET, 0, 0, _RET_KILL_PROCESS),
               (_LD_ABS_W, 0, 0, _OFFSET_NR)]
    if architecture == "x86_64":  # the x32 ABI reaches the same kernel through other numbers: refuse all of it
        program += [(_JGE, 0, 1, _X32_SYSCALL_BIT), (_RET, 0, 0, _RET_ERRNO | errno.EPERM)]
    for name in sorted(set(table) - {"clone", "clone3"}):
        program += [(_JEQ, 0, 1, table[name]), (_RET, 0, 0, _RET_ERRNO | errno.EPERM)]
    program += [(_JEQ, 0, 1, table["clone3"]), (_RET, 0, 0, _RET_ERRNO | errno.ENOSYS)]
    # clone: threads pass; any namespace flag fails.
    program += [(_JEQ, 0, 3, table["clone"]), (_LD_ABS_W, 0, 0, _OFFSET_ARG0), (_JSET, 0, 1, _CLONE_NAMESPACE_FLAGS),
                (_RET, 0, 0, _RET_ERRNO | errno.EPERM), (_RET, 0, 0, _RET_ALLOW)]
    return program


def set_no_new_privs() -> None:
    """After this, no execve can raise privileges (setuid binaries, file capabilities); Landlock and seccomp need it."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


def install() -> bool:
    """Load the filter for this thread and the threads it starts later; False on an architecture without a table."""
    architecture = supported_architecture()
    if architecture is None:
        return False
    instructions = build_filter(architecture)
    array = (_Instruction * len(instructions))(*[_Instruction(*instruction) for instruction in instructions])
    program = _Program(len(instructions), ctypes.cast(array, ctypes.POINTER(_Instruction)))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")
    return True
