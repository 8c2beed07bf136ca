"""The sandboxed side: `python -m workers.pytorch.child REQUEST.json` loads a checked PyTorch file and exports or compares it.

Started only by sandbox.py, inside a private folder, with resource limits and (where the kernel
allows) no network namespace. Before the model is touched, an audit hook refuses sockets, new
processes and writes outside the private folder, so a model that tries any of them fails with a
readable error instead of doing it. The result (or the error) is written as JSON next to the request.
"""
from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path

_BLOCKED_EVENTS = ("socket.connect", "socket.bind", "socket.getaddrinfo", "socket.sendto", "subprocess.Popen", "os.system",
                   "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn", "urllib.Request")
_WRITE_MODES = set("wax+")


def install_guard(private_dir: Path) -> None:
    """Refuse network, processes and writes outside `private_dir` for the rest of this process's life."""
    root = str(private_dir.resolve())

    def guard(event: str, args: tuple) -> None:
        if event.startswith(_BLOCKED_EVENTS):
            raise PermissionError(f"the sandbox refuses {event}")
        if event == "open" and len(args) >= 2:
            path, mode = args[0], args[1]
            writing = isinstance(mode, str) and bool(_WRITE_MODES & set(mode))
            if not writing and isinstance(args[2] if len(args) > 2 else None, int):
                writing = bool(args[2] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
            if writing and isinstance(path, str | bytes | os.PathLike):
                target = os.path.realpath(os.fsdecode(path))
                if not (target == root or target.startswith(root + os.sep) or target == os.devnull):
                    raise PermissionError(f"the sandbox refuses writing outside its folder: {os.path.basename(target)}")

    sys.addaudithook(guard)


def _preload() -> None:
    """Import what the work needs before the guard is on (imports themselves read and map files)."""
    import numpy  # noqa: F401
    import onnx  # noqa: F401
    import onnxruntime  # noqa: F401
    import torch
    import torch.onnx

    from . import export  # noqa: F401

    torch.set_num_threads(1)
    try:
        import onnxscript  # noqa: F401
        from torch.onnx._internal.exporter import _core  # noqa: F401
    except ImportError:
        pass  # the dynamo exporter then fails and the TorchScript-based one is used, with that reason


def _convert(request: dict, work: Path) -> dict:
    from .export import dataset_batches, example_inputs, export_onnx, load_model, parity

    model = load_model(request["kind"], Path(request["model"]))
    onnx_path = Path(request["onnx"])
    exported = export_onnx(model, onnx_path)
    if request.get("inputs"):
        batches = dataset_batches(model.inputs, Path(request["inputs"]), max_samples=int(request.get("max_samples", 64)))
    else:
        batches = [example_inputs(model.inputs, seed=seed) for seed in range(2)]
    return {**exported, "inputs": model.inputs, "torch_op_histogram": model.op_histogram, "torch_parameter_count": model.parameter_count,
            "parity": parity(model, onnx_path, batches), "torch_version": __import__("torch").__version__}


def _parity(request: dict, work: Path) -> dict:
    from .export import dataset_batches, load_model, parity

    model = load_model(request["kind"], Path(request["model"]))
    batches = dataset_batches(model.inputs, Path(request["inputs"]), max_samples=int(request.get("max_samples", 64)))
    return {"parity": parity(model, Path(request["onnx"]), batches)}


COMMANDS = {"convert": _convert, "parity": _parity}


def apply_limits(limits: dict) -> None:
    memory = int(limits["memory_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (int(limits["cpu_seconds"]), int(limits["cpu_seconds"]) + 5))
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(limits["file_bytes"]), int(limits["file_bytes"])))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main(request_path: str) -> int:
    request_file = Path(request_path)
    work = request_file.parent
    request = json.loads(request_file.read_text())
    apply_limits(request["limits"])
    _preload()
    install_guard(work)
    try:
        result = COMMANDS[request["command"]](request, work)
        status = 0
    except BaseException as error:  # everything the model does wrong becomes a message, not a crash
        result = {"error": f"{type(error).__name__}: {error}"[:2000]}
        status = 2
    (work / "result.json").write_text(json.dumps(result, default=str))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
