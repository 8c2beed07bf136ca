"""Find out which runtimes can actually load and compile a built variant."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from devices import support
from devices.artifacts import OPENVINO_IR, TFLITE, artifact_format
from kiln_contract import operator_support

logger = logging.getLogger(__name__)


def runnable_backends(path: str | Path) -> list[str]:
    """Return the backends ("onnxruntime", "openvino", "litert") that load and compile this model on the host CPU."""
    return load_check(path)[0]


def load_check(path: str | Path) -> tuple[list[str], dict[str, str]]:
    """(the backends that load and compile this model on the host CPU, {backend: its runtime's reason} for those that refuse it).

    A LiteRT flatbuffer is LiteRT's alone, an OpenVINO IR OpenVINO's alone; an ONNX file is tried on the ONNX runtimes.
    A runtime that is not installed here is neither: nothing can be claimed for it.
    """
    path = Path(path)
    if artifact_format(path) == TFLITE:
        checks = {"litert": _litert_refusal}
    elif artifact_format(path) == OPENVINO_IR:
        checks = {"openvino": _openvino_refusal}
    else:
        checks = {"onnxruntime": _onnxruntime_refusal, "openvino": _openvino_refusal}
    runnable, refused = [], {}
    for backend, refusal in checks.items():
        reason = refusal(path)
        if reason is None:
            runnable.append(backend)
        elif reason:
            logger.info("%s: %s", path.name, reason)
            refused[backend] = reason
    return runnable, refused


def _onnxruntime_refusal(path: Path) -> str | None:
    import onnxruntime as ort

    options = ort.SessionOptions()
    # Only "can it load": optimizations would cost time without changing the answer.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:
        return f"ONNX Runtime {ort.__version__} cannot load the model: {operator_support.first_lines(str(error))}"
    return None


def _litert_refusal(path: Path) -> str | None:
    from devices.backends.litert import LiteRtBackend

    try:
        with tempfile.TemporaryDirectory(prefix="kiln-litert-check-") as scratch:
            LiteRtBackend().compile(path, scratch, threads=1).close()
    except Exception as error:
        return f"LiteRT cannot load the model: {operator_support.first_lines(str(error))}"
    return None


def _openvino_refusal(path: Path) -> str | None:
    """OpenVINO's reason for refusing the model; "" when OpenVINO is not installed (an optional extra: nothing can be claimed)."""
    try:
        import openvino
    except ImportError:
        return ""
    from devices.backends.openvino import OpenVinoBackend, compile_model, read_artifact

    core = openvino.Core()
    try:
        # read_model alone accepts some graphs the CPU plugin then rejects, so compile too, as the agent will.
        compile_model(core, read_artifact(core, path), threads=None, options={})
    except Exception as error:
        # A refusal of the reader is told as the agent's support check tells it (naming the Loop that holds what it refused).
        answer = support.ask(OpenVinoBackend(), path)
        if answer["verdict"] == operator_support.CANNOT_RUN and answer.get("reason"):
            return answer["reason"]
        return f"OpenVINO {OpenVinoBackend().version()} cannot compile the model: {operator_support.first_lines(str(error))}"
    return None
