"""What the sandbox asks of the kernel, in order, and a record of what the kernel granted.

`enter(plan)` runs first thing in the child, before it imports anything that parses a user's file:

1. new namespaces: network (no interfaces but loopback, down), PID (it sees only itself), IPC, UTS, mount,
   and a user namespace when the process is not root;
2. a new root holding only the Python installation, the packages it imports, the system libraries and
   the work folder (`namespaces.build_root`), with a fresh /proc of its own PID namespace;
3. an unprivileged identity: a root process becomes `uid` (65534, nobody, unless configured), a non-root
   one drops the capabilities its user namespace gave it;
4. no_new_privs, then Landlock (read the plan's paths, write only the work folder, no execve, no TCP),
   then a seccomp filter (no sockets, mounts, namespaces, ptrace, BPF, io_uring, execve...).

Each step is tried on its own: where the kernel refuses one (a container without user namespaces, a
kernel without Landlock), the others still apply and the record says which held. rlimits are set by the
child before this (they need no privilege and always work).
"""
from __future__ import annotations

import os
import signal
import site
import stat
import sys
import sysconfig
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import landlock, namespaces, seccomp

NOBODY = 65534
SYSTEM_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin", "/etc/ld.so.cache", "/etc/ld.so.conf",
                "/etc/ld.so.conf.d", "/etc/localtime", "/sys/devices/system/cpu")
# The confinements that count as the operating system's; rlimits and the audit hook alone do not.
OS_CONFINEMENTS = ("user", "mount_namespace", "network_namespace", "landlock", "seccomp")
LAYERS = ("namespaces", "user", "landlock", "seccomp")


@dataclass
class Plan:
    """What the child may see: `readable` trees read-only, `work` read-write, `hidden` masked even inside a readable tree."""

    work: str
    readable: list[str]
    hidden: list[str] = field(default_factory=list)
    new_root: str | None = None
    uid: int = NOBODY
    # Which walls to raise; all of them, except in the tests that show each one holds on its own.
    layers: list[str] = field(default_factory=lambda: list(LAYERS))


@dataclass
class Granted:
    """Which confinements the kernel granted this process (False/None: refused, with the reason in `notes`)."""

    user: str | None = None
    mount_namespace: bool = False
    network_namespace: bool = False
    pid_namespace: bool = False
    landlock: int = 0
    seccomp: bool = False
    no_new_privs: bool = False
    notes: list[str] = field(default_factory=list)

    def os_confined(self) -> bool:
        return any(getattr(self, name) for name in OS_CONFINEMENTS)

    def as_dict(self) -> dict:
        return asdict(self)


def readable_paths(*, packages: list[str]) -> list[str]:
    """The trees a Python child needs to start and import: this interpreter, its site-packages, the system libraries.

    Built from the interpreter's own layout, never from this process's sys.path (whose first entry may be a
    script's folder or the current directory). `packages` are the project's own package folders; the
    project root itself is never bound (it may hold the data folder, the secret key, the git history).
    """
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    layout = {value for key, value in sysconfig.get_paths().items() if key in ("stdlib", "platstdlib", "purelib", "platlib")}
    return sorted({*roots, *layout, *site.getsitepackages(), *packages, *SYSTEM_PATHS})


def _readable_by_anyone(path: str) -> bool:
    """Whether an unrelated user could reach `path`: every folder above it searchable by others, itself readable."""
    current = Path(path)
    if not current.exists():
        return True
    for folder in [*reversed(current.parents), current]:
        mode = folder.stat().st_mode
        if not mode & (stat.S_IXOTH if folder.is_dir() else stat.S_IROTH):
            return False
    return True


def enter(plan: Plan) -> Granted:
    """Confine this (single-threaded) process as far as the kernel allows; see the module docstring."""
    granted = Granted()
    privileged = os.geteuid() == 0
    flags = _unshare(granted, privileged=privileged) if "namespaces" in plan.layers else 0
    if flags & namespaces.CLONE_NEWPID:
        _become_pid_one()
        granted.pid_namespace = True
    if flags & namespaces.CLONE_NEWNS and plan.new_root:
        try:
            granted.notes += namespaces.build_root(Path(plan.new_root), readable=plan.readable, writable=[plan.work],
                                                   hidden=plan.hidden)
            granted.mount_namespace = True
        except OSError as error:
            granted.notes.append(f"file tree: {error}")
    if "user" in plan.layers:
        _drop_identity(granted, plan, privileged=privileged)
    # A change of identity clears the parent-death signal: set it again, so this process dies with its parent.
    namespaces.die_with_parent()
    _restrict(granted, plan)
    return granted


def _unshare(granted: Granted, *, privileged: bool) -> int:
    wanted = (namespaces.CLONE_NEWNS | namespaces.CLONE_NEWNET | namespaces.CLONE_NEWPID | namespaces.CLONE_NEWIPC
              | namespaces.CLONE_NEWUTS | (0 if privileged else namespaces.CLONE_NEWUSER))
    uid, gid = os.getuid(), os.getgid()
    for flags in (wanted, wanted & ~namespaces.CLONE_NEWPID, namespaces.CLONE_NEWNET | (0 if privileged else namespaces.CLONE_NEWUSER)):
        try:
            namespaces.unshare(flags)
        except OSError as error:
            granted.notes.append(f"unshare {flags:#x}: {error.strerror}")
            continue
        if flags & namespaces.CLONE_NEWUSER:
            namespaces.map_user(uid, gid)
        granted.network_namespace = True
        return flags
    return 0


def _become_pid_one() -> None:
    """A new PID namespace takes effect for children: fork, and let the parent only wait and pass on the status."""
    child = os.fork()
    if child == 0:
        namespaces.die_with_parent()
        return
    # The child is its namespace's init, which ignores every signal it has no handler for (SIGTERM included,
    # even from root outside): whatever would end this process ends the child with SIGKILL.
    for forwarded in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(forwarded, lambda _number, _frame: os.kill(child, signal.SIGKILL))
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number not in (signal.SIGKILL, signal.SIGSTOP):  # neither can have a handler, nor be given one back
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _drop_identity(granted: Granted, plan: Plan, *, privileged: bool) -> None:
    try:
        if privileged and not granted.mount_namespace and not all(_readable_by_anyone(path) for path in plan.readable):
            # Without its own file tree, an unprivileged user could not even start Python from here.
            granted.notes.append(f"identity: stays root: the Python installation is not readable by uid {plan.uid} "
                                 "and no mount namespace could show it")
        elif privileged:
            os.chown(plan.work, plan.uid, plan.uid)
            for entry in Path(plan.work).iterdir():  # never through a link: it could name any file of the host
                os.chown(entry, plan.uid, plan.uid, follow_symlinks=False)
            namespaces.drop_to_user(plan.uid, plan.uid)
            granted.user = f"uid {plan.uid}"
        elif granted.network_namespace:
            namespaces.drop_capabilities()
            granted.user = f"uid {os.getuid()} in its own user namespace"
    except OSError as error:
        granted.notes.append(f"identity: {error}")


def _restrict(granted: Granted, plan: Plan) -> None:
    try:
        seccomp.set_no_new_privs()
        granted.no_new_privs = True
    except OSError as error:
        granted.notes.append(f"no_new_privs: {error}")
        return
    if "landlock" in plan.layers:
        _landlock(granted, plan)
    if "seccomp" in plan.layers:
        try:
            granted.seccomp = seccomp.install()
            if not granted.seccomp:
                granted.notes.append(f"seccomp: no filter table for {os.uname().machine}")
        except OSError as error:
            granted.notes.append(f"seccomp: {error}")


def _landlock(granted: Granted, plan: Plan) -> None:
    devices = [f"/dev/{name}" for name in namespaces.DEVICES]
    # /tmp and /dev/shm are private tmpfs only inside the new root; outside it they are the host's, and stay shut.
    private = ["/tmp", "/dev/shm"] if granted.mount_namespace else []
    try:
        granted.landlock = landlock.restrict(readable=[*plan.readable, "/proc/self", *devices, *private],
                                             writable=[plan.work, "/dev/null", *private])
        if not granted.landlock:
            granted.notes.append("landlock: not offered by this kernel")
    except OSError as error:
        granted.notes.append(f"landlock: {error}")
