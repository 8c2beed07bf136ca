"""Find out which runtimes can actually load and compile a built variant."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from devices.artifacts import OPENVINO_IR, TFLITE, artifact_format

logger = logging.getLogger(__name__)


def runnable_backends(path: str | Path) -> list[str]:
    """Return the backends ("onnxruntime", "openvino", "litert") that load and compile this model on the host CPU.

    A LiteRT flatbuffer is LiteRT's alone, an OpenVINO IR OpenVINO's alone; an ONNX file is tried on the ONNX runtimes.
    """
    path = Path(path)
    if artifact_format(path) == TFLITE:
        return ["litert"] if _litert_loads(path) else []
    if artifact_format(path) == OPENVINO_IR:
        return ["openvino"] if _openvino_compiles(path) else []
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


def _litert_loads(path: Path) -> bool:
    from devices.backends.litert import LiteRtBackend

    try:
        with tempfile.TemporaryDirectory(prefix="kiln-litert-check-") as scratch:
            LiteRtBackend().compile(path, scratch, threads=1).close()
    except Exception as error:
        logger.info("LiteRT cannot load %s: %s", path.name, error)
        return False
    return True


def _openvino_compiles(path: Path) -> bool:
    try:
        import openvino
    except ImportError:  # OpenVINO is an optional extra; without it nothing can be claimed.
        return False
    from devices.backends.openvino import compile_model, read_artifact

    core = openvino.Core()
    try:
        # read_model alone accepts some graphs the CPU plugin then rejects, so compile too, as the agent will.
        compile_model(core, read_artifact(core, path), threads=None, options={})
    except Exception as error:
        logger.info("openvino cannot compile %s: %s", path.name, error)
        return False
    return True
