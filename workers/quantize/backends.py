"""Find out which runtimes can actually load and compile a built variant."""

from __future__ import annotations

import logging
from pathlib import Path

logger = logging.getLogger(__name__)


def runnable_backends(path: str | Path) -> list[str]:
    """Return the backends ("onnxruntime", "openvino") that load and compile this model on the host CPU."""
    path = Path(path)
    backends = []
    if _onnxruntime_loads(path):
        backends.append("onnxruntime")
    if _openvino_compiles(path):
        backends.append("openvino")
    return backends


def _onnxruntime_loads(path: Path) -> bool:
    import onnxruntime as ort

    options = ort.SessionOptions()
    # Only "can it load": optimizations would cost time without changing the answer.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:
        logger.info("onnxruntime cannot load %s: %s", path.name, error)
        return False
    return True


def _openvino_compiles(path: Path) -> bool:
    try:
        import openvino
    except ImportError:  # OpenVINO is an optional extra; without it nothing can be claimed.
        return False
    core = openvino.Core()
    try:
        # read_model alone accepts some graphs the CPU plugin then rejects, so compile too.
        core.compile_model(core.read_model(str(path)), "CPU")
    except Exception as error:
        logger.info("openvino cannot compile %s: %s", path.name, error)
        return False
    return True
