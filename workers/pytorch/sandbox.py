"""Run PyTorch loading and export in a child process that cannot reach the network or exhaust the worker.

The child (child.py) gets a private temporary folder as its cwd, HOME and TMPDIR, an environment
without proxies or credentials, address-space, CPU-time and file-size limits (which it sets on
itself before importing anything), its own session and process group, and, where unprivileged user namespaces work, an empty network namespace (`unshare -rn`).
Whatever happens inside comes back as a dict or as SandboxFailed with a readable reason.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_MEMORY_MB = 6144
DEFAULT_CPU_SECONDS = 600
DEFAULT_WALL_SECONDS = 900
MAX_FILE_BYTES = 8 << 30
_KEPT_ENVIRONMENT = ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "VIRTUAL_ENV")


class SandboxFailed(RuntimeError):
    """The model could not be loaded, exported or compared; the message is for the user."""


@functools.cache
def network_namespace_prefix() -> tuple[str, ...]:
    """`unshare -rn` when this kernel lets an unprivileged process drop its network, else nothing (the audit guard still blocks sockets)."""
    unshare = shutil.which("unshare")
    if not unshare:
        return ()
    try:
        ok = subprocess.run([unshare, "-rn", "true"], capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return (unshare, "-rn") if ok else ()


def _environment(private: Path) -> dict[str, str]:
    env = {key: os.environ[key] for key in _KEPT_ENVIRONMENT if key in os.environ}
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo, env.get("PYTHONPATH", "")]))
    env.update(HOME=str(private), TMPDIR=str(private), PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1", NO_PROXY="*")
    return env


def run_in_sandbox(request: dict, *, memory_mb: int = DEFAULT_MEMORY_MB, cpu_seconds: int = DEFAULT_CPU_SECONDS,
                   wall_seconds: int = DEFAULT_WALL_SECONDS, files: dict[str, Path] | None = None) -> dict:
    """Run one child command; `files` are copied into the private folder and passed by their key's name.

    Paths the child writes (keys ending in `_out`) are named in the request and read back by the caller
    from `request[key]` after the run, so the caller passes its own destination folder in `outputs_dir`.
    """
    private = Path(tempfile.mkdtemp(prefix="kiln-torch-"))
    try:
        # The child sets these limits on itself first thing, before it imports or loads anything
        # (a preexec_fn would be unsafe in the threaded web server).
        staged = {**request, "limits": {"memory_mb": memory_mb, "cpu_seconds": cpu_seconds, "file_bytes": MAX_FILE_BYTES}}
        for key, source in (files or {}).items():
            target = private / f"{key}{Path(source).suffix}"
            shutil.copyfile(source, target)
            staged[key] = str(target)
        if "onnx" not in staged:
            staged["onnx"] = str(private / "model.onnx")
        request_path = private / "request.json"
        request_path.write_text(json.dumps(staged))
        command = [*network_namespace_prefix(), sys.executable, "-m", "workers.pytorch.child", str(request_path)]
        process = subprocess.Popen(command, cwd=private, env=_environment(private), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            output, _ = process.communicate(timeout=wall_seconds)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise SandboxFailed(f"loading the model took longer than {wall_seconds} s and was stopped") from None
        result = _read_result(private, process.returncode, output.decode("utf-8", errors="replace"), memory_mb=memory_mb, cpu_seconds=cpu_seconds)
        if "error" in result:
            # The user reads this: it names their file, never the server's folders.
            raise SandboxFailed(str(result["error"]).replace(str(private) + os.sep, "").replace(str(private), ""))
        onnx_path = Path(staged["onnx"])
        if onnx_path.exists() and "onnx_out" in request:
            Path(request["onnx_out"]).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(onnx_path), request["onnx_out"])
            for side in private.glob(onnx_path.name + ".data"):
                shutil.move(str(side), Path(request["onnx_out"]).with_name(Path(request["onnx_out"]).name + ".data"))
        return result
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _read_result(private: Path, returncode: int, output: str, *, memory_mb: int, cpu_seconds: int) -> dict:
    result_path = private / "result.json"
    if result_path.exists():
        return json.loads(result_path.read_text())
    if returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return {"error": f"loading the model used more than {cpu_seconds} s of CPU time and was stopped"}
    tail = output.strip().splitlines()[-3:]
    if any("MemoryError" in line or "bad_alloc" in line or "Cannot allocate" in line for line in tail):
        return {"error": f"loading the model needed more than {memory_mb} MB of memory"}
    return {"error": f"the model loader crashed (exit status {returncode}): {' '.join(tail)[-500:]}"}
