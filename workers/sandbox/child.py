"""The sandboxed side: `python -m workers.sandbox.child REQUEST.json` confines itself, then runs one named command.

Started only by runner.py. Order matters: rlimits, then the OS confinement (confine.enter), and only then
the import of the command's module, so that nothing that parses the user's file runs unconfined. The
result (or the error) is written as JSON next to the request.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import resource
import sys
from pathlib import Path

from .confine import Plan, enter
from .namespaces import die_with_parent
from .redact import without_addresses

# Commands by name; the request names one, never a module path.
COMMANDS = {
    "probe": "workers.sandbox.probe:escapes",
    "torch.convert": "workers.pytorch.commands:convert",
    "torch.parity": "workers.pytorch.commands:parity",
    "onnx.inspect": "workers.inspect:inspect_upload",
    "onnx.convert": "workers.convert:convert_command",
    "onnx.validate": "workers.inspect:validate_command",
    "reference.compute": "workers.reference:reference_command",
    "calibration.calls": "workers.calibration_set:calibration_command",
    "quantize.build": "workers.quantize.isolated:build_command",
    "quantize.rank": "workers.quantize.isolated:rank_command",
    "dataset.inspect": "workers.dataset_commands:inspect",
    "dataset.hdf5": "workers.dataset_commands:hdf5",
    "dataset.raw": "workers.dataset_commands:raw",
    "dataset.preview": "workers.dataset_commands:preview",
    "support.check": "workers.support:check_command",
}


def apply_limits(limits: dict) -> None:
    """The kernel's own backstops (the parent also watches the whole tree); a None limit is left unset."""
    if limits.get("memory_mb"):
        memory = int(limits["memory_mb"]) << 20
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    if limits.get("cpu_seconds"):
        resource.setrlimit(resource.RLIMIT_CPU, (int(limits["cpu_seconds"]), int(limits["cpu_seconds"]) + 5))
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(limits["file_bytes"]), int(limits["file_bytes"])))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if limits.get("background"):
        run_in_background()


BACKGROUND_NICE = 19


def run_in_background() -> None:
    """The lowest CPU priority, for work nobody waits on (an upload's operator-support check): it runs on what the host's
    builds and timings leave idle, so a hostile file that computes until its limit slows nobody else down. The child
    leads a session of its own, and with the kernel's autogroup scheduling a session's share is set by its autogroup's
    nice value, not its processes': both are lowered (raising a nice value needs no privilege)."""
    os.setpriority(os.PRIO_PROCESS, 0, BACKGROUND_NICE)
    with contextlib.suppress(OSError):
        Path("/proc/self/autogroup").write_text(f"{BACKGROUND_NICE}\n")


def priority() -> dict:
    """The child's CPU priority as the kernel holds it: its nice value and its autogroup's (None without autogroups)."""
    autogroup = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        autogroup = int(Path("/proc/self/autogroup").read_text().split("nice")[1].strip())
    return {"nice": os.getpriority(os.PRIO_PROCESS, 0), "autogroup_nice": autogroup}


def _run(request: dict, work: Path) -> tuple[dict, int]:
    granted = enter(Plan(**request["plan"]))
    if request.get("require_os_confinement") and not granted.os_confined():
        reasons = "; ".join(granted.notes) or "no reason given"
        return {"error": "this server's kernel grants none of the sandbox's confinements (user or mount namespaces, Landlock, "
                         f"seccomp: {reasons}), so it parses no user's model or dataset; in development only, "
                         "KILN_SANDBOX_ALLOW_UNCONFINED=true (with KILN_DEBUG=true) runs it unconfined", "unconfined": True, "sandbox": granted.as_dict()}, 3
    module_name, function_name = COMMANDS[request["command"]].split(":")
    function = getattr(importlib.import_module(module_name), function_name)
    try:
        result, status = function(request, work), 0
    except BaseException as error:  # everything a user's file does wrong becomes a message, not a crash
        result, status = _failure(error), 2
    result["sandbox"] = {**granted.as_dict(), "priority": priority()}
    return result, status


def _failure(error: BaseException) -> dict:
    """An error a command raised on purpose (it has a `code`) is told as is; anything else with its type."""
    if isinstance(error, MemoryError):  # the address-space limit: the parent names it (SandboxLimitExceeded)
        return {"error": "out of memory", "code": "sandbox_memory_limit"}
    code = getattr(error, "code", None)
    text = without_addresses(str(error) if isinstance(code, str) else f"{type(error).__name__}: {error}")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > 6:  # a TorchScript traceback: its first line and the cause at its end are what a user reads
        text = f"{lines[0]} ... {' '.join(lines[-3:])}"
    return {"error": text[:2000], "code": code if isinstance(code, str) else None}


def main(request_path: str) -> int:
    request_file = Path(request_path)
    work = request_file.parent
    request = json.loads(request_file.read_text())
    # Die with the worker that started this child, even one killed outright (no orphan keeps parsing).
    die_with_parent()
    if request.get("parent_pid") and os.getppid() != request["parent_pid"]:
        return 4
    apply_limits(request["limits"])
    result, status = _run(request, work)
    (work / "result.json").write_text(json.dumps(result, default=str))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
