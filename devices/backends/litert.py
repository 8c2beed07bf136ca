"""LiteRT (TFLite) backend: ai-edge-litert's Interpreter with its default XNNPACK delegate.

LiteRT does not read ONNX: the host converts a LiteRT variant to a `.tflite` flatbuffer
(`workers.quantize.litert`), at fixed shapes, with the ONNX model's input and output names as its
signature's names and its layouts (inputs stay NCHW, outputs come back in ONNX order), so the agent
feeds it exactly what it feeds the ONNX variants. "Compiling" is loading: the interpreter applies
XNNPACK to every operator it supports when the model is allocated, and the artifact uploaded is
the flatbuffer itself. The agent's only LiteRT dependency is the `ai-edge-litert` wheel.
"""

from __future__ import annotations

import functools
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from devices.artifacts import TFLITE, artifact_format
from devices.backends.base import Backend, CompiledModel, TensorSpec
from devices.backends.options import parse_compile_options
from devices.cpus import usable_cores

logger = logging.getLogger(__name__)

ARTIFACT_NAME = "model.tflite"
DISTRIBUTION = "ai-edge-litert"


def _interpreter_class():
    from ai_edge_litert.interpreter import Interpreter

    return Interpreter


def _signature_io(interpreter) -> tuple[dict[str, dict], dict[str, dict]]:
    """Input and output details by name: the signature's names (the ONNX model's), else the tensors' own."""
    signatures = interpreter.get_signature_list()
    if len(signatures) == 1:
        runner = interpreter.get_signature_runner(next(iter(signatures)))
        # Indices are the main subgraph's: the one signature Kiln writes runs subgraph 0, which invoke() runs.
        if getattr(runner, "_subgraph_index", 0) == 0:
            return runner.get_input_details(), runner.get_output_details()
    return ({detail["name"]: detail for detail in interpreter.get_input_details()},
            {detail["name"]: detail for detail in interpreter.get_output_details()})


class LiteRtCompiledModel(CompiledModel):
    """An allocated LiteRT interpreter over the `.tflite` artifact."""

    def __init__(self, artifact_path: Path, threads: int, options: dict[str, Any] | None = None):
        self.artifact_path = artifact_path
        self.options = parse_compile_options(options)
        self.threads = threads
        # The default op resolver applies XNNPACK (LiteRT's CPU delegate) to every operator it supports.
        self.interpreter = _interpreter_class()(model_path=str(artifact_path), num_threads=threads)
        self.interpreter.allocate_tensors()
        inputs, outputs = _signature_io(self.interpreter)
        self._inputs = {name: (int(detail["index"]), np.dtype(detail["dtype"])) for name, detail in inputs.items()}
        self._outputs = {name: int(detail["index"]) for name, detail in outputs.items()}
        self.input_specs = [TensorSpec(name=name, dtype=np.dtype(detail["dtype"]), shape=tuple(int(d) for d in detail["shape"]))
                            for name, detail in inputs.items()]
        self.output_names = list(outputs)
        _check_static_shapes(self.input_specs, self.options.get("static_shapes") or {})

    def _set_inputs(self, feeds: dict[str, np.ndarray]) -> None:
        for name, (index, dtype) in self._inputs.items():
            if name not in feeds:
                raise KeyError(f"missing input {name!r}")
            self.interpreter.set_tensor(index, np.ascontiguousarray(feeds[name], dtype=dtype))

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._set_inputs(feeds)
        self.interpreter.invoke()
        # get_tensor copies, so the outputs outlive the next invoke.
        return {name: self.interpreter.get_tensor(index) for name, index in self._outputs.items()}

    def bind(self, feeds: dict[str, np.ndarray]) -> Callable[[], Any]:
        """The inputs are set once; the bound call is one `invoke()` (valid until the next bind() or run())."""
        self._set_inputs(feeds)
        return functools.partial(self.interpreter.invoke)

    def profile(self, feeds: dict[str, np.ndarray], runs: int = 10, warmup_runs: int = 1) -> dict:
        raise NotImplementedError("LiteRT's Python interpreter has no per-operator profiler; "
                                  "the latency above is the whole model under XNNPACK")

    def close(self) -> None:
        self.interpreter = None


def _check_static_shapes(specs: list[TensorSpec], static_shapes: dict[str, list[int]]) -> None:
    """LiteRT variants are built at fixed shapes: static shapes may only restate them."""
    by_name = {spec.name: spec for spec in specs}
    for name, dims in static_shapes.items():
        if name not in by_name:
            raise ValueError(f"static_shapes names no input of the model: {name}")
        if tuple(dims) != by_name[name].shape:
            raise ValueError(f"LiteRT variants are built at fixed shapes: input {name!r} is {list(by_name[name].shape)}, not {dims}")


class LiteRtBackend(Backend):
    """LiteRT's Interpreter on the CPU with the XNNPACK delegate."""

    name = "litert"

    def available(self) -> bool:
        try:
            _interpreter_class()
        except Exception:
            return False
        return True

    def version(self) -> str | None:
        if not self.available():
            return None
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version(DISTRIBUTION)
        except PackageNotFoundError:
            return None

    def compile(
        self, model_path: str | Path, work_dir: str | Path, *, threads: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> LiteRtCompiledModel:
        compile_options = parse_compile_options(options)
        if artifact_format(model_path) != TFLITE:
            raise ValueError("LiteRT runs .tflite variants (Kiln's LiteRT family converts them on the server); this file is ONNX")
        work_dir = Path(work_dir)
        work_dir.mkdir(parents=True, exist_ok=True)
        artifact_path = work_dir / ARTIFACT_NAME
        shutil.copyfile(model_path, artifact_path)
        # Left to itself the interpreter picks one thread; like ONNX Runtime, default to the physical cores it may use.
        threads = compile_options.get("threads") or threads or usable_cores()[0]
        return LiteRtCompiledModel(artifact_path, int(threads), compile_options)
