"""The parent side of the sandbox: stage a user's files in a private folder, run one command confined, read the answer.

The child (`python -m workers.sandbox.child`) gets the private folder as its cwd, HOME and TMPDIR, an
environment without proxies or credentials, its own session and process group, rlimits it sets on itself
first, and then whatever OS confinement the kernel grants (confine.py). Whatever happens inside comes
back as a dict or as SandboxFailed with a readable reason.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from devices.quiet import BuildPauser
from workers import host_memory

from . import policy
from .confine import LAYERS, Plan, readable_paths
from .redact import without_addresses

DEFAULT_MEMORY_MB = 6144
DEFAULT_CPU_SECONDS = 600
DEFAULT_WALL_SECONDS = 900
# How often the parent looks at the child's tree (memory, CPU time, wall time).
WATCH_SECONDS = 0.1
MAX_FILE_BYTES = 8 << 30
# The project's packages a child may import; the project root itself (data folder, secret key, .git) stays out.
CHILD_PACKAGES = ("workers", "devices", "kiln_contract")


def package_folder(name: str) -> Path:
    """Where a package of the project is on this host (a checkout, or site-packages in an installed server)."""
    return Path(importlib.util.find_spec(name).origin).resolve().parent
_KEPT_ENVIRONMENT = ("PATH", "LANG", "LC_ALL", "VIRTUAL_ENV")


class SandboxFailed(RuntimeError):
    """The command could not run to the end; the message is for the user, `code` says what kind of failure it was."""

    def __init__(self, message: str, *, code: str | None = None):
        super().__init__(message)
        self.code = code


class Unconfined(SandboxFailed):
    """This host's kernel granted none of the OS confinements, and running unconfined was not allowed."""


class SandboxLimitExceeded(SandboxFailed):
    """The child passed one of its limits and was killed (SIGKILL, its whole tree); `limit` names which.

    `limit` is "memory", "cpu" or "wall", `value` the limit in `unit` ("MB", "s of CPU time", "s"): the caller
    can tell the user which limit the upload hit.
    """

    UNITS = {"memory": "MB", "cpu": "s of CPU time", "wall": "s"}

    def __init__(self, limit: str, value: float, *, what: str = "the work"):
        self.limit, self.value, self.unit = limit, value, self.UNITS[limit]
        amount = f"{value:g} {self.unit}"
        text = {"memory": f"{what} needed more than {amount} of memory (the sandbox's memory limit) and was stopped",
                "cpu": f"{what} used more than {amount} (the sandbox's CPU limit) and was stopped",
                "wall": f"{what} took longer than {amount} (the sandbox's time limit) and was stopped"}[limit]
        super().__init__(text, code=f"sandbox_{limit}_limit")


@dataclass
class Limits:
    """What a child may use. `memory_mb` is its address space (RLIMIT_AS); `rss_mb`, when set, is watched from
    outside instead (builds: runtimes reserve far more address space than they touch). None: no such limit."""

    memory_mb: int | None = DEFAULT_MEMORY_MB
    cpu_seconds: int | None = DEFAULT_CPU_SECONDS
    wall_seconds: float = DEFAULT_WALL_SECONDS
    rss_mb: int | None = None


def _environment(private: Path, packages: Path, *, threads: int | None = 1) -> dict[str, str]:
    env = {key: os.environ[key] for key in _KEPT_ENVIRONMENT if key in os.environ}
    env.update(HOME=str(private), TMPDIR=str(private), PYTHONPATH=str(packages), PYTHONDONTWRITEBYTECODE="1",
               NO_PROXY="*", PYTHONNOUSERSITE="1")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def _package_links(folder: Path) -> Path:
    """A folder holding only links to the project's packages, for the child's PYTHONPATH.

    Python lists each folder on its path; the project root itself is neither shown in the sandbox nor readable
    under Landlock, so the child imports through this folder (readable) and the links (to readable trees).
    """
    folder.mkdir()
    for name in CHILD_PACKAGES:
        (folder / name).symlink_to(package_folder(name), target_is_directory=True)
    return folder


def _secret_folders() -> list[str]:
    """Folders that hold the server's state; masked if a readable tree happens to contain them."""
    data = Path(os.environ.get("KILN_DATA_DIR", "var")).resolve()
    found = {str(data), str(Path(os.environ.get("KILN_BLOB_ROOT", data / "blobs")).resolve()), str(Path.home() / ".config")}
    return sorted(found)


def model_shown(model_path: str | Path, folder: Path | None = None) -> tuple[Path, ...]:
    """What a child may read of a model: its own folder when it has one (an extracted zip), else the file and its `.data`."""
    if folder is not None:
        return (Path(folder),)
    model_path = Path(model_path)
    side = model_path.with_name(model_path.name + ".data")
    return (model_path, side) if side.is_file() else (model_path,)


def plan_for(work: Path, new_root: Path, *, uid: int) -> Plan:
    packages = [str(package_folder(name)) for name in CHILD_PACKAGES]
    return Plan(work=str(work), readable=readable_paths(packages=packages), hidden=_secret_folders(), new_root=str(new_root), uid=uid)


def run_confined(command: str, request: dict, *, files: dict[str, Path] | None = None, memory_mb: int | None = DEFAULT_MEMORY_MB,
                 cpu_seconds: int | None = DEFAULT_CPU_SECONDS, wall_seconds: float = DEFAULT_WALL_SECONDS,
                 allow_unconfined: bool | None = None, outputs: dict[str, Path] | None = None, uid: int | None = None,
                 layers: tuple[str, ...] = LAYERS, shared: tuple[Path, ...] = (), rss_mb: int | None = None,
                 pause: Callable[[int], object] | None = BuildPauser, threads: int | None = 1, what: str = "the work",
                 booked_as: str | None = None, on_memory_wait: Callable[[str], None] | None = None, background: bool = False) -> dict:
    """Run `command` (a name in child.COMMANDS) on `request`; `files` are copied in and passed by their key's name.

    `shared` files or folders are shown to the child read-only where they are, not copied (a large model);
    `uid` is the identity a child started by root takes and `allow_unconfined` whether it may run where the
    kernel grants no OS confinement (both default to workers.sandbox.policy, the one owner); `layers` narrows
    the confinement (tests only). `outputs` maps names of files the child writes in its folder (with any
    `<name>.data` beside them) to where the caller wants them; everything else in the private folder is deleted.
    A child past `memory_mb`/`rss_mb`, `cpu_seconds` or `wall_seconds` is killed and SandboxLimitExceeded names
    the limit (`what` is how the message names the work). `pause(pid)` makes an object with `start()`,
    `stop()` and `paused_seconds()` (devices.quiet.BuildPauser): time paused does not count against the wall
    limit; every sandbox of a host pauses so by default, being Kiln's own work. `threads` caps OpenMP's threads
    (None: the host's default, for builds). The child starts once its memory limit fits beside what the host's other
    builds and sandboxes booked (workers/host_memory.py; `booked_as` names it there, `on_memory_wait(reason)` is told
    when it waits). `background`: the child runs at the lowest CPU priority (workers.sandbox.child.run_in_background),
    for work nobody waits on.
    """
    allow_unconfined = policy.allow_unconfined() if allow_unconfined is None else allow_unconfined
    uid = policy.sandbox_uid() if uid is None else uid
    limits = Limits(memory_mb=memory_mb, cpu_seconds=cpu_seconds, wall_seconds=wall_seconds, rss_mb=rss_mb)
    scratch = Path(tempfile.mkdtemp(prefix="kiln-sandbox-"))
    private, new_root = scratch / "work", scratch / "root"
    private.mkdir()
    new_root.mkdir()
    os.chmod(scratch, 0o755)
    packages = _package_links(scratch / "packages")
    try:
        reserved = {"command", "require_os_confinement", "parent_pid", "limits", "plan"} & set(request)
        if reserved:  # the runner's own keys: a request that used one would be silently overwritten
            raise ValueError(f"a sandbox request may not use the key(s) {', '.join(sorted(reserved))}")
        staged = {**request, "command": command, "require_os_confinement": not allow_unconfined, "parent_pid": os.getpid(),
                  "limits": {"memory_mb": memory_mb, "cpu_seconds": cpu_seconds, "file_bytes": MAX_FILE_BYTES, "background": background},
                  "plan": _plan_dict(plan_for(private, new_root, uid=uid), layers=layers, shared=shared, packages=packages)}
        for key, source in (files or {}).items():
            target = private / f"{key}{Path(source).suffix}"
            shutil.copyfile(source, target)
            staged[key] = str(target)
        (private / "request.json").write_text(json.dumps(staged))
        with host_memory.reserved(memory_mb or rss_mb or DEFAULT_MEMORY_MB, what=booked_as or what, on_wait=on_memory_wait) as waited_s:
            output, returncode, usage = _run_child(private, packages, limits=limits, pause=_pauser(pause, background=background),
                                                   threads=threads, what=what)
        usage.memory_wait_s = round(waited_s, 3)
        result = _read_result(private, returncode, output, limits=limits, usage=usage)
        if "error" in result:
            message = without_addresses(str(result["error"]).replace(str(private) + os.sep, "").replace(str(private), ""))
            if str(result.get("code") or "").startswith("sandbox_memory"):
                raise SandboxLimitExceeded("memory", memory_mb or rss_mb or 0, what=what)
            raise (Unconfined if result.get("unconfined") else SandboxFailed)(message, code=result.get("code"))
        for name, destination in (outputs or {}).items():
            _move_out(private, name, Path(destination))
        return {**result, "usage": asdict(usage)}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _pauser(pause: Callable[[int], object] | None, *, background: bool) -> Callable[[int], object] | None:
    """The host's pause for this child: work in the background pauses for timing windows, but no agent leaves it a turn."""
    if background and pause is BuildPauser:
        return functools.partial(BuildPauser, background=True)
    return pause


def _plan_dict(plan: Plan, *, layers: tuple[str, ...], shared: tuple[Path, ...], packages: Path) -> dict:
    for path in shared:
        _let_anyone_read(Path(path))
    plan.readable = sorted({*plan.readable, str(packages), *(str(Path(path).resolve()) for path in shared)})
    return {**asdict(plan), "layers": list(layers)}


def _let_anyone_read(path: Path) -> None:
    """A shared upload must be readable by the sandbox's unprivileged user; the folders above it still keep others out."""
    for item in [path, *(path.rglob("*") if path.is_dir() else [])]:
        if not item.is_symlink():
            item.chmod(item.stat().st_mode | (0o555 if item.is_dir() else 0o444))


def _inside(private: Path, path: Path) -> bool:
    """Whether `path` is a plain file of the child's folder: no link in it anywhere, so the parent never acts on a host
    file the child pointed at (a `converted -> /var/lib/kiln` link makes `converted/model.onnx` a host path)."""
    relative = path.relative_to(private)
    current = private
    for part in relative.parts:
        current = current / part
        if current.is_symlink():
            return False
    return path.is_file()


def _move_out(private: Path, name: str, destination: Path) -> None:
    path = private / name
    if not _inside(private, path):
        return
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(path), destination)
    side = path.with_name(path.name + ".data")
    if _inside(private, side):
        shutil.move(str(side), destination.with_name(destination.name + ".data"))


@dataclass
class Usage:
    """What a child used, as the parent's watch saw it (resident memory and CPU time of its whole tree)."""

    peak_rss_mb: float = 0.0
    cpu_s: float = 0.0
    paused_s: float = 0.0
    memory_wait_s: float = 0.0


def _run_child(private: Path, packages: Path, *, limits: Limits, pause, threads: int | None, what: str) -> tuple[str, int, Usage]:
    command = [sys.executable, "-m", "workers.sandbox.child", str(private / "request.json")]
    log_path = private.parent / "output.txt"  # outside the child's folder: it writes through the inherited descriptor only
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, cwd=private, env=_environment(private, packages, threads=threads), stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    pauser = pause(process.pid) if pause else None
    usage = Usage()
    if pauser is not None:
        pauser.start()
    try:
        exceeded = _watch(process, limits, pauser, usage)
    finally:
        if pauser is not None:
            usage.paused_s = pauser.paused_seconds()
            pauser.stop()
        kill_tree(process)
    if exceeded:
        raise SandboxLimitExceeded(exceeded, {"memory": limits.rss_mb, "cpu": limits.cpu_seconds, "wall": limits.wall_seconds}[exceeded],
                                   what=what)
    return log_path.read_bytes()[-65536:].decode("utf-8", errors="replace"), process.returncode, usage


def _watch(process: subprocess.Popen, limits: Limits, pauser, usage: Usage) -> str | None:
    """Wait for the child; the limit it passed (memory, cpu, wall) if it had to be stopped, else None.

    The kernel's rlimits stay as a backstop; this watch also counts the CPU time and resident memory of every
    process of the child's tree, which per-process rlimits do not.
    """
    started = time.monotonic()
    while True:
        try:
            process.wait(timeout=WATCH_SECONDS)
            return None
        except subprocess.TimeoutExpired:
            pass
        paused = pauser.paused_seconds() if pauser is not None else 0.0
        if time.monotonic() - started - paused > limits.wall_seconds:
            return "wall"
        rss_mb, cpu_s = _tree_usage(process.pid)
        usage.peak_rss_mb, usage.cpu_s = max(usage.peak_rss_mb, rss_mb), max(usage.cpu_s, cpu_s)
        if limits.rss_mb and rss_mb > limits.rss_mb:
            return "memory"
        if limits.cpu_seconds and cpu_s > limits.cpu_seconds:
            return "cpu"


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _tree_usage(pid: int) -> tuple[float, float]:
    """Resident MB and CPU seconds of a process and everything under it, as far as they can be read now.

    A child that shares its parent's memory is counted once: between a vfork and its exec (every subprocess Python
    starts, and the ones the sandbox refuses to exec) the child's resident set *is* its parent's, and adding it twice
    stopped builds for memory they never used.
    """
    rss = cpu = 0.0
    footprints: dict[int, tuple[int, int]] = {}
    for process in _tree(pid):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            memory = process.memory_info()
            times = process.cpu_times()
            cpu += times.user + times.system
            footprints[process.pid] = (memory.rss, memory.vms)
            if footprints.get(process.ppid()) != footprints[process.pid]:  # the root's parent is outside the tree
                rss += memory.rss
    return rss / (1 << 20), cpu


def kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL the child and everything under it, now: SIGKILL ends a process busy in native code (SIGTERM need not),
    and the sandbox's PID-namespace init ignores any signal it has no handler for except SIGKILL and SIGSTOP.

    Only while the child is unreaped (`poll()` is None), so its pid and process group cannot belong to anyone else.
    """
    if process.poll() is None:
        for member in reversed(_tree(process.pid)):
            with contextlib.suppress(psutil.NoSuchProcess):
                member.send_signal(signal.SIGCONT)  # a tree paused by a BuildPauser still dies, and at once
                member.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _read_result(private: Path, returncode: int, output: str, *, limits: Limits, usage: Usage) -> dict:
    result_path = private / "result.json"
    try:
        # Never through a link: the child could point result.json at any file of the host.
        fd = os.open(result_path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        fd = None
    except OSError:
        return {"error": "the sandboxed process left an unreadable result"}
    if fd is not None:
        with os.fdopen(fd, "rb") as handle:
            try:
                return json.loads(handle.read(64 << 20))
            except ValueError:
                return {"error": "the sandboxed process left an unreadable result"}
    # The kernel's CPU rlimit sends SIGXCPU, then SIGKILL: a SIGKILL is the limit only when the CPU time got there.
    if limits.cpu_seconds and (returncode == -signal.SIGXCPU or (returncode == -signal.SIGKILL and usage.cpu_s >= 0.9 * limits.cpu_seconds)):
        raise SandboxLimitExceeded("cpu", limits.cpu_seconds)
    if returncode < 0:
        return {"error": f"the sandboxed process was killed ({_signal_name(-returncode)})"}
    tail = output.strip().splitlines()[-3:]
    if any("MemoryError" in line or "bad_alloc" in line or "Cannot allocate" in line for line in tail):
        raise SandboxLimitExceeded("memory", limits.memory_mb or limits.rss_mb or 0)
    return {"error": f"the sandboxed process crashed (exit status {returncode}): {' '.join(tail)[-500:]}"}


def probe(*, uid: int | None = None, layers: tuple[str, ...] = LAYERS) -> dict:
    """What this host's kernel grants a sandboxed child (`sandbox`) and which escapes it then stops (`escapes`).

    The targets are real: a world-readable file and a world-writable folder outside the child's folder, a
    listening TCP port on loopback and this process; afterwards the folder is checked from outside too.
    """
    with tempfile.TemporaryDirectory(prefix="kiln-probe-") as outside, socket.create_server(("127.0.0.1", 0)) as listener:
        os.chmod(outside, 0o777)  # so that only the sandbox, not file permissions, can stop the write
        secret = Path(outside) / "secret"
        secret.write_text("kiln-probe-secret")
        secret.chmod(0o644)
        targets = {"server_pid": os.getpid(), "secret_file": str(secret), "outside_folder": outside, "port": listener.getsockname()[1]}
        result = run_confined("probe", {"targets": targets}, memory_mb=1024, cpu_seconds=30, wall_seconds=60, allow_unconfined=True,
                              uid=uid, layers=layers)
        escapes = result["escapes"]
        if [path for path in Path(outside).iterdir() if path != secret]:
            escapes["write outside its folder"] = "ALLOWED (a file appeared outside)"
    return {"sandbox": result["sandbox"], "escapes": escapes}
