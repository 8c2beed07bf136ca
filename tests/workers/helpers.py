"""Helpers shared by the toolchain tests (fixtures live in conftest.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def run_model(path: Path | str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run a model file on onnxruntime CPU with one thread (the test machine is shared)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)
