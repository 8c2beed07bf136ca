"""The PyTorch commands the sandbox runs (workers/sandbox/child.py calls them, already confined).

Before the model is touched, an audit hook refuses sockets, new processes and writes outside the
private folder: a last, in-process wall behind the OS confinement and the operator allow-list, which
turns an attempt into a readable error instead of an obscure one.
"""
from __future__ import annotations

import os
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


def _prepare(work: Path) -> None:
    """Import what the work needs, then guard (imports themselves read and map files)."""
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
    install_guard(work)


def convert(request: dict, work: Path) -> dict:
    _prepare(work)
    from .export import dataset_batches, example_inputs, export_onnx, load_model, parity

    model = load_model(request["kind"], Path(request["model"]), check_operators=request.get("check_operators", True))
    onnx_path = work / "model.onnx"
    exported = export_onnx(model, onnx_path)
    if request.get("inputs"):
        batches = dataset_batches(model.inputs, Path(request["inputs"]), max_samples=int(request.get("max_samples", 64)))
    else:
        batches = [example_inputs(model.inputs, seed=seed) for seed in range(2)]
    return {**exported, "inputs": model.inputs, "torch_op_histogram": model.op_histogram, "torch_parameter_count": model.parameter_count,
            "parity": parity(model, onnx_path, batches), "torch_version": __import__("torch").__version__}


def parity(request: dict, work: Path) -> dict:
    _prepare(work)
    from .export import dataset_batches, load_model
    from .export import parity as compare

    model = load_model(request["kind"], Path(request["model"]), check_operators=request.get("check_operators", True))
    batches = dataset_batches(model.inputs, Path(request["inputs"]), max_samples=int(request.get("max_samples", 64)))
    return {"parity": compare(model, Path(request["onnx"]), batches)}
