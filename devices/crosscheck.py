"""A runtime self-check: the compiled model's outputs against a reference runtime's, on a few samples.

Accuracy against the FP32 reference cannot tell a variant that quantization hurt from a runtime that
misreads the file: OpenVINO read one QDQ text detector into outputs with mask IoU 0.0013 where ONNX
Runtime, running the very same file, kept 0.974 (issue 24). Both runtimes executing one file should
agree up to kernel rounding, far above quantization noise, so a cosine below FAULT_COSINE on any
output is the runtime's fault, not the variant's, and the task says so instead of measuring it.

What the reference is depends on the artifact (`reference_for`):
- an ONNX file on another runtime than ONNX Runtime: the same file on ONNX Runtime (`cross_check`);
- a file ONNX Runtime cannot read (an OpenVINO IR, a LiteRT flatbuffer): its FP32 source on ONNX Runtime,
  whose outputs for the validation samples the task already carries as the reference (`source_check`).
  That comparison holds the variant's quantization noise as well (0.76 and up on the real models of
  benchmarks/selfcheck_zoo.py, MiniLM-L3's hidden states the lowest), still clear of FAULT_COSINE; it cannot
  tell a runtime's fault from a quantization that ruined the model, and fails both;
- an ONNX file on ONNX Runtime: nothing (it is the reference).
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from devices.artifacts import ONNX, OPENVINO_IR, TFLITE, artifact_format
from devices.backends.base import BackendUnavailable, CompiledModel
from devices.backends.registry import get_backend
from kiln_contract.metrics import cosine_similarity

logger = logging.getLogger(__name__)

REFERENCE_BACKEND = "onnxruntime"
# What a file ONNX Runtime cannot read is checked against: its FP32 source's outputs on ONNX Runtime (the task's reference).
FLOAT_SOURCE = "fp32 source on onnxruntime"
# Samples of the validation set a file ONNX Runtime cannot read is run on for the check.
SOURCE_SAMPLES = 4
FORMAT_NAMES = {OPENVINO_IR: "IR", TFLITE: "LiteRT flatbuffer"}
# Quantization noise keeps cosines near 1 (0.76 and up on the real models, benchmarks/RESULTS.md); a runtime fault drops them near 0.
FAULT_COSINE = 0.5
# The check compiles the model a second time on the device; above this size that costs more than the check is worth.
MAX_MODEL_BYTES = 1 << 30


class RuntimeFault(Exception):
    """The runtime's outputs disagree with its reference's far beyond quantization noise; `check` is the measured comparison."""

    def __init__(self, message: str, check: dict[str, Any]):
        super().__init__(message)
        self.check = check


def reference_for(backend_name: str, model_path: str | Path) -> str | None:
    """What the compiled model is checked against: REFERENCE_BACKEND (the same file), FLOAT_SOURCE, or None (not checked)."""
    if artifact_format(model_path) != ONNX:
        return FLOAT_SOURCE
    if backend_name != REFERENCE_BACKEND and Path(model_path).stat().st_size <= MAX_MODEL_BYTES:
        return REFERENCE_BACKEND
    return None


def applies(backend_name: str, model_path: str | Path) -> bool:
    """Whether the same file is run on ONNX Runtime: another runtime, on a file ONNX Runtime reads, of a size worth it."""
    return reference_for(backend_name, model_path) == REFERENCE_BACKEND


def cross_check(compiled: CompiledModel, model_path: str | Path, feeds: dict[str, np.ndarray], *, backend_name: str) -> dict[str, Any] | None:
    """Compare `compiled` with ONNX Runtime on `feeds` (a few samples at a batch the model takes); None when nothing can be compared.

    Returns `{"against", "samples", "cosine": {output: value}, "min_cosine", "fault"}`; raises RuntimeFault
    (carrying that dict) when an output's cosine is below FAULT_COSINE.
    """
    if not applies(backend_name, model_path):
        return None
    rows = {name: np.ascontiguousarray(array) for name, array in feeds.items()}
    try:
        with tempfile.TemporaryDirectory(prefix="kiln-crosscheck-") as scratch:
            reference_model = get_backend(REFERENCE_BACKEND).compile(model_path, scratch, threads=1)
            try:
                expected = reference_model.run(rows)
            finally:
                reference_model.close()
    except BackendUnavailable:
        return None
    except Exception as error:  # ONNX Runtime refusing a file another runtime took is no verdict on that runtime
        logger.info("runtime self-check skipped: ONNX Runtime cannot run %s: %s", Path(model_path).name, error)
        return None
    return _judge(compiled.run(rows), expected, against=REFERENCE_BACKEND, samples=len(next(iter(rows.values()))),
                  fault=lambda worst, lowest: f"runtime fault: {backend_name} and {REFERENCE_BACKEND} disagree on the same file "
                                              f"(output {worst!r}: cosine {lowest:.3f} < {FAULT_COSINE}), far beyond quantization noise")


def source_check(outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray], model_path: str | Path, *, backend_name: str,
                 precision: str = "", samples: int) -> dict[str, Any] | None:
    """Compare a file ONNX Runtime cannot read with its FP32 source: `outputs` are the compiled model's for the first rows
    of the validation set (samples, or calls of sequences), `reference` the FP32 source's for the whole set on ONNX Runtime.

    Returns the dict `cross_check` returns, `against` FLOAT_SOURCE; raises RuntimeFault under FAULT_COSINE.
    """
    rows = {name: np.asarray(value) for name, value in outputs.items() if np.ndim(value)}
    count = min((len(value) for value in rows.values()), default=0)
    # Only outputs of the reference's per-row shape: one that does not match is the evaluation's error to report, not a fault.
    expected = {name: np.asarray(value)[:count] for name, value in reference.items()
                if name in rows and np.ndim(value) and len(value) >= count and np.shape(value)[1:] == rows[name].shape[1:]}
    if not count:
        return None
    what = " ".join(part for part in (backend_name, precision.upper(), FORMAT_NAMES.get(artifact_format(model_path), "file")) if part)
    return _judge({name: value[:count] for name, value in rows.items()}, expected, against=FLOAT_SOURCE, samples=samples,
                  fault=lambda worst, lowest: f"runtime fault: {what} disagrees with its FP32 source on ONNX Runtime: cosine {lowest:.3f} "
                                              f"on output {worst!r} (< {FAULT_COSINE}), far beyond quantization noise")


def _judge(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray], *, against: str, samples: int, fault) -> dict[str, Any] | None:
    """The check's dict from each shared output's cosine; RuntimeFault with `fault(worst output, its cosine)` under FAULT_COSINE."""
    cosines = {name: round(cosine_similarity(actual[name], expected[name]), 6) for name in expected if name in actual}
    if not cosines:
        return None
    lowest = min(cosines.values())
    check = {"against": against, "samples": samples, "cosine": cosines, "min_cosine": lowest, "fault": lowest < FAULT_COSINE}
    if check["fault"]:
        raise RuntimeFault(fault(min(cosines, key=cosines.get), lowest), check)
    return check
