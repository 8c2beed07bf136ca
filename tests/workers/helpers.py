"""Helpers shared by the toolchain tests (fixtures live in conftest.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from devices.backends.registry import get_backend


def run_model(path: Path | str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run a model file on onnxruntime CPU with one thread (the test machine is shared)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def run_on_device_backend(path: Path, inputs: np.ndarray, *, input_name: str = "input", rows: int | None = None) -> np.ndarray:
    """The first output of `path` compiled by the agent's ONNX Runtime backend, as a device runs a variant (`rows` at a
    time when given)."""
    compiled = get_backend("onnxruntime").compile(path, path.parent / f"{path.stem}-compiled", threads=1)
    step = rows or len(inputs)
    try:
        return np.concatenate([compiled.run({input_name: inputs[start:start + step]})[compiled.output_names[0]]
                               for start in range(0, len(inputs), step)])
    finally:
        compiled.close()
