"""Linux namespaces for the sandbox: no network, a private process table, and a file tree of only what is needed.

`unshare` + `build_root` give the process a new root on a tmpfs into which the Python installation, the
packages on its path and the system libraries are bound read-only at their usual paths, its work folder
read-write, and nothing else: not the server's data folder, not /etc beyond the dynamic linker's cache,
not /home, not the host's /proc. Everything here is plain syscalls through ctypes (no setuid helper).
"""
from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable
from pathlib import Path

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
_PR_SET_PDEATHSIG = 1
# statvfs flags that a remount inside a user namespace must keep (the kernel locks them)
_LOCKED = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC), (os.ST_NOATIME, MS_NOATIME),
           (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME))
DEVICES = ("null", "zero", "full", "random", "urandom")


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p)
    return libc


def _check(result: int, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def unshare(flags: int) -> None:
    _check(_libc().unshare(ctypes.c_int(flags)), "unshare")


def map_user(uid: int, gid: int) -> None:
    """In a new user namespace, keep this process's own ids (nothing is mapped to root outside)."""
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")


def die_with_parent() -> None:
    import signal

    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _bytes(value: str | None) -> bytes | None:
    return value.encode() if value is not None else None


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc().mount(_bytes(source), _bytes(target), _bytes(fstype), flags, _bytes(data)), f"mount {target}")


def _bind_read_only(source: str, target: Path) -> None:
    if os.path.isdir(source):
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
    mount(source, str(target), None, MS_BIND)
    locked = os.statvfs(source).f_flag
    kept = sum(flag for statvfs_flag, flag in _LOCKED if locked & statvfs_flag)
    mount(None, str(target), None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | kept)


def _bind_writable(source: str, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    mount(source, str(target), None, MS_BIND)


def build_root(new_root: Path, *, readable: Iterable[str], writable: Iterable[str], hidden: Iterable[str]) -> list[str]:
    """Assemble the sandbox's file tree under `new_root` (already an empty directory) and pivot into it.

    Returns what could not be made (for the record; the pivot itself must succeed or this raises).
    """
    notes: list[str] = []
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", str(new_root), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16m")
    # /tmp first: the work folder usually lives under it and is bound inside this tmpfs, not hidden by it.
    (new_root / "tmp").mkdir()
    mount("tmpfs", str(new_root / "tmp"), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=1777,size=64m")
    _make_dev(new_root)
    trees = _outermost(readable)
    for path in trees:
        if os.path.islink(path) and os.path.dirname(path) == "/":  # merged /usr: /lib -> usr/lib
            os.symlink(os.readlink(path), new_root / path.lstrip("/"))
        elif os.path.exists(path):
            _bind_read_only(path, new_root / path.lstrip("/"))
    for path in writable:
        _bind_writable(path, new_root / path.lstrip("/"))
    for path in hidden:  # a secret folder that a readable tree happens to contain (not one a shared file merely lies in)
        target = new_root / path.lstrip("/")
        if target.is_dir() and any(path.startswith(tree.rstrip("/") + "/") for tree in trees):
            mount("tmpfs", str(target), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "size=4k")
    (new_root / "etc").mkdir(exist_ok=True)
    (new_root / "etc" / "passwd").write_text("root:x:0:0::/:/nonexistent\nnobody:x:65534:65534::/nonexistent:/nonexistent\n")
    (new_root / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    (new_root / "proc").mkdir(exist_ok=True)
    try:
        mount("proc", str(new_root / "proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError as error:  # the kernel lets a user namespace mount proc only where no part of /proc is masked
        notes.append(f"/proc: {error.strerror}")
    _pivot(new_root)
    mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    return notes


def _make_dev(new_root: Path) -> None:
    dev = new_root / "dev"
    dev.mkdir(exist_ok=True)
    for name in DEVICES:
        target = dev / name
        target.touch()
        mount(f"/dev/{name}", str(target), None, MS_BIND)
    (dev / "shm").mkdir(exist_ok=True)
    mount("tmpfs", str(dev / "shm"), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=1777,size=64m")


def _pivot(new_root: Path) -> None:
    old = new_root / ".old-root"
    old.mkdir()
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    pivot_root = {"x86_64": 155, "aarch64": 41}[os.uname().machine]
    _check(int(libc.syscall(pivot_root, str(new_root).encode(), str(old).encode())), "pivot_root")
    os.chdir("/")
    _check(libc.umount2(b"/.old-root", MNT_DETACH), "umount old root")
    os.rmdir("/.old-root")


def _outermost(paths: Iterable[str]) -> list[str]:
    """The given paths without those inside another (binding a tree binds what is in it)."""
    kept: list[str] = []
    for path in sorted({os.path.normpath(p) for p in paths}, key=len):
        if not any(path == outer or path.startswith(outer.rstrip("/") + "/") for outer in kept):
            kept.append(path)
    return kept


def drop_to_user(uid: int, gid: int) -> None:
    """From root: give up every group and become `uid`/`gid` for good (all capabilities go with it)."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """Empty this process's capability sets (those a new user namespace granted it)."""
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (_CapData * 2)()
    _check(_libc().capset(ctypes.byref(header), data), "capset")
