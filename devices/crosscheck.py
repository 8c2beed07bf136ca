"""A runtime self-check: the compiled model's outputs against the same ONNX file on ONNX Runtime, on a few samples.

Accuracy against the FP32 reference cannot tell a variant that quantization hurt from a runtime that
misreads the file: OpenVINO read one QDQ text detector into outputs with mask IoU 0.0013 where ONNX
Runtime, running the very same file, kept 0.974 (issue 24). Both runtimes executing one file should
agree up to kernel rounding, far above quantization noise, so a cosine below FAULT_COSINE on any
output is the runtime's fault, not the variant's, and the task says so instead of measuring it.
Only files ONNX Runtime reads are checked (not a LiteRT flatbuffer or an OpenVINO IR).
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from devices.artifacts import ONNX, artifact_format
from devices.backends.base import BackendUnavailable, CompiledModel
from devices.backends.registry import get_backend
from devices.metrics import cosine_similarity

logger = logging.getLogger(__name__)

REFERENCE_BACKEND = "onnxruntime"
# Quantization noise keeps cosines near 1 (0.95 and up on real models); a runtime fault drops them near 0.
FAULT_COSINE = 0.5
# The check compiles the model a second time on the device; above this size that costs more than the check is worth.
MAX_MODEL_BYTES = 1 << 30


class RuntimeFault(Exception):
    """The runtime's outputs for a file disagree with ONNX Runtime's for the same file far beyond quantization noise."""

    def __init__(self, message: str, check: dict[str, Any]):
        super().__init__(message)
        self.check = check


def applies(backend_name: str, model_path: str | Path) -> bool:
    """Whether the compiled model is checked: another runtime than ONNX Runtime, on a file ONNX Runtime reads, of a size worth it."""
    return (backend_name != REFERENCE_BACKEND and artifact_format(model_path) == ONNX
            and Path(model_path).stat().st_size <= MAX_MODEL_BYTES)


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
    actual = compiled.run(rows)
    cosines = {name: round(cosine_similarity(actual[name], expected[name]), 6) for name in expected if name in actual}
    if not cosines:
        return None
    lowest = min(cosines.values())
    check = {"against": REFERENCE_BACKEND, "samples": len(next(iter(rows.values()))), "cosine": cosines,
             "min_cosine": lowest, "fault": lowest < FAULT_COSINE}
    if check["fault"]:
        worst = min(cosines, key=cosines.get)
        raise RuntimeFault(f"runtime fault: {backend_name} and {REFERENCE_BACKEND} disagree on the same file "
                           f"(output {worst!r}: cosine {lowest:.3f} < {FAULT_COSINE}), far beyond quantization noise", check)
    return check
