"""The parent side of the sandbox: stage a user's files in a private folder, run one command confined, read the answer.

The child (`python -m workers.sandbox.child`) gets the private folder as its cwd, HOME and TMPDIR, an
environment without proxies or credentials, its own session and process group, rlimits it sets on itself
first, and then whatever OS confinement the kernel grants (confine.py). Whatever happens inside comes
back as a dict or as SandboxFailed with a readable reason.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from .confine import LAYERS, NOBODY, Plan, readable_paths

DEFAULT_MEMORY_MB = 6144
DEFAULT_CPU_SECONDS = 600
DEFAULT_WALL_SECONDS = 900
MAX_FILE_BYTES = 8 << 30
# The project's packages a child may import; the project root itself (data folder, secret key, .git) stays out.
CHILD_PACKAGES = ("workers", "devices")


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


def _environment(private: Path, packages: Path) -> dict[str, str]:
    env = {key: os.environ[key] for key in _KEPT_ENVIRONMENT if key in os.environ}
    env.update(HOME=str(private), TMPDIR=str(private), PYTHONPATH=str(packages), PYTHONDONTWRITEBYTECODE="1",
               OMP_NUM_THREADS="1", NO_PROXY="*", PYTHONNOUSERSITE="1")
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


def plan_for(work: Path, new_root: Path, *, uid: int) -> Plan:
    packages = [str(package_folder(name)) for name in CHILD_PACKAGES]
    return Plan(work=str(work), readable=readable_paths(packages=packages), hidden=_secret_folders(), new_root=str(new_root), uid=uid)


def run_confined(command: str, request: dict, *, files: dict[str, Path] | None = None, memory_mb: int = DEFAULT_MEMORY_MB,
                 cpu_seconds: int = DEFAULT_CPU_SECONDS, wall_seconds: int = DEFAULT_WALL_SECONDS, allow_unconfined: bool = False,
                 outputs: dict[str, Path] | None = None, uid: int = NOBODY, layers: tuple[str, ...] = LAYERS,
                 shared: tuple[Path, ...] = ()) -> dict:
    """Run `command` (a name in child.COMMANDS) on `request`; `files` are copied in and passed by their key's name.

    `shared` files or folders are shown to the child read-only where they are, not copied (a large model);
    `uid` is the identity a child started by root takes; `layers` narrows the confinement (tests only).
    `outputs` maps names of files the child writes in its folder (with any `<name>.data` beside them) to
    where the caller wants them; everything else in the private folder is deleted.
    """
    scratch = Path(tempfile.mkdtemp(prefix="kiln-sandbox-"))
    private, new_root = scratch / "work", scratch / "root"
    private.mkdir()
    new_root.mkdir()
    os.chmod(scratch, 0o755)
    packages = _package_links(scratch / "packages")
    try:
        staged = {**request, "command": command, "require_os_confinement": not allow_unconfined,
                  "limits": {"memory_mb": memory_mb, "cpu_seconds": cpu_seconds, "file_bytes": MAX_FILE_BYTES},
                  "plan": _plan_dict(plan_for(private, new_root, uid=uid), layers=layers, shared=shared, packages=packages)}
        for key, source in (files or {}).items():
            target = private / f"{key}{Path(source).suffix}"
            shutil.copyfile(source, target)
            staged[key] = str(target)
        (private / "request.json").write_text(json.dumps(staged))
        output, returncode = _run_child(private, packages, wall_seconds=wall_seconds)
        result = _read_result(private, returncode, output, memory_mb=memory_mb, cpu_seconds=cpu_seconds)
        if "error" in result:
            message = str(result["error"]).replace(str(private) + os.sep, "").replace(str(private), "")
            raise (Unconfined if result.get("unconfined") else SandboxFailed)(message, code=result.get("code"))
        for name, destination in (outputs or {}).items():
            _move_out(private / name, Path(destination))
        return result
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


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


def _move_out(path: Path, destination: Path) -> None:
    if not path.is_file() or path.is_symlink():
        return
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(path), destination)
    side = path.with_name(path.name + ".data")
    if side.is_file() and not side.is_symlink():
        shutil.move(str(side), destination.with_name(destination.name + ".data"))


def _run_child(private: Path, packages: Path, *, wall_seconds: int) -> tuple[str, int]:
    command = [sys.executable, "-m", "workers.sandbox.child", str(private / "request.json")]
    process = subprocess.Popen(command, cwd=private, env=_environment(private, packages), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=wall_seconds)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise SandboxFailed(f"the work took longer than {wall_seconds} s and was stopped") from None
    return output.decode("utf-8", errors="replace"), process.returncode


def _read_result(private: Path, returncode: int, output: str, *, memory_mb: int, cpu_seconds: int) -> dict:
    result_path = private / "result.json"
    if result_path.exists():
        return json.loads(result_path.read_text())
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return {"error": f"the work used more than {cpu_seconds} s of CPU time and was stopped"}
    tail = output.strip().splitlines()[-3:]
    if any("MemoryError" in line or "bad_alloc" in line or "Cannot allocate" in line for line in tail):
        return {"error": f"the work needed more than {memory_mb} MB of memory"}
    return {"error": f"the sandboxed process crashed (exit status {returncode}): {' '.join(tail)[-500:]}"}


def probe(*, uid: int = NOBODY, layers: tuple[str, ...] = LAYERS) -> dict:
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
