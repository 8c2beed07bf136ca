"""Load, export and compare a user's PyTorch file, confined (workers/sandbox) and limited by the operator allow-list."""
from __future__ import annotations

from pathlib import Path

from workers.sandbox.runner import DEFAULT_CPU_SECONDS, DEFAULT_MEMORY_MB, SandboxFailed, Unconfined, run_confined

__all__ = ["SandboxFailed", "Unconfined", "run_in_sandbox"]
COMMANDS = {"convert": "torch.convert", "parity": "torch.parity"}


def run_in_sandbox(request: dict, *, files: dict[str, Path], memory_mb: int = DEFAULT_MEMORY_MB, cpu_seconds: int = DEFAULT_CPU_SECONDS,
                   allow_unconfined: bool | None = None, check_operators: bool = True, uid: int | None = None) -> dict:
    """Run `request["command"]` ("convert" or "parity"); a converted model lands at `request["onnx_out"]`.

    `check_operators=False` exists for the tests that prove the OS confinement holds on its own.
    """
    body = {key: value for key, value in request.items() if key not in ("command", "onnx_out")}
    body["check_operators"] = check_operators
    outputs = {"model.onnx": Path(request["onnx_out"])} if request.get("onnx_out") else None
    return run_confined(COMMANDS[request["command"]], body, files=files, memory_mb=memory_mb, cpu_seconds=cpu_seconds,
                        allow_unconfined=allow_unconfined, outputs=outputs, uid=uid)
