"""ONNX Runtime (CPU execution provider) backend."""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from devices.backends.base import Backend, CompiledModel, TensorSpec, summarize_profile
from devices.backends.options import parse_compile_options
from devices.cpus import usable_cores
from kiln_contract import operator_support

logger = logging.getLogger(__name__)

ARTIFACT_NAME = "model.ort-optimized.onnx"
# ORT's refusal of a node no execution provider implements: "Could not find an implementation for Foo(7) node with name 'bar'".
UNIMPLEMENTED = re.compile(r"implementation for (\w+)\(\d+\) node with name '([^']*)'")
# ...and of an operator from a domain it does not know: "com.example:Foo(-1) is not a registered function/op".
UNREGISTERED = re.compile(r"([\w.]*):(\w+)\(-?\d+\) is not a registered function/op")


def _refused_nodes(message: str) -> list[tuple[str, str]]:
    """(node name, operator type) of each node ORT's load error names."""
    return ([(name, op_type) for op_type, name in UNIMPLEMENTED.findall(message)]
            + [(f"{op_type} ({domain or 'ai.onnx'})", op_type) for domain, op_type in UNREGISTERED.findall(message)])

_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(int16)": np.int16,
    "tensor(uint16)": np.uint16,
    "tensor(int32)": np.int32,
    "tensor(uint32)": np.uint32,
    "tensor(int64)": np.int64,
    "tensor(uint64)": np.uint64,
    "tensor(bool)": np.bool_,
}


def ort_dtype(type_name: str) -> np.dtype:
    """The numpy dtype of an onnxruntime type name such as `tensor(int64)`."""
    return np.dtype(_ORT_TYPES.get(type_name, np.float32))


def _spec(node_arg, static_shapes: dict[str, list[int]]) -> TensorSpec:
    dtype = ort_dtype(node_arg.type)
    if node_arg.name in static_shapes:
        return TensorSpec(name=node_arg.name, dtype=dtype, shape=tuple(static_shapes[node_arg.name]))
    shape = tuple(dim if isinstance(dim, int) and dim > 0 else None for dim in node_arg.shape)
    return TensorSpec(name=node_arg.name, dtype=dtype, shape=shape)


def _level(ort, name: str):
    return {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[name]


def free_dimension_overrides(model_path: str | Path, static_shapes: dict[str, list[int]]) -> dict[str, int]:
    """`{dim_param: value}` that pins each named dynamic input dimension to the data's shape.

    ORT overrides free dimensions by their symbolic name, so an input whose dynamic dimension has
    no name cannot be specialised this way; a mismatch with a fixed dimension is an error.
    """
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    unknown = sorted(set(static_shapes) - {value.name for value in graph.input})
    if unknown:
        raise ValueError(f"static_shapes names no input of the model: {', '.join(unknown)}")
    overrides: dict[str, int] = {}
    for value in graph.input:
        dims = static_shapes.get(value.name)
        if dims is None:
            continue
        declared = value.type.tensor_type.shape.dim
        if len(declared) != len(dims):
            raise ValueError(f"static shape {dims} for input {value.name!r} has {len(dims)} dimensions; the model's has {len(declared)}")
        for dim, wanted in zip(declared, dims):
            if dim.HasField("dim_value") and dim.dim_value > 0 and dim.dim_value != wanted:
                raise ValueError(f"static shape {dims} for input {value.name!r} contradicts its fixed dimension {dim.dim_value}")
            if dim.HasField("dim_param") and dim.dim_param and overrides.setdefault(dim.dim_param, wanted) != wanted:
                raise ValueError(f"dimension {dim.dim_param!r} is given two sizes ({overrides[dim.dim_param]} and {wanted})")
    return overrides


class OnnxRuntimeCompiledModel(CompiledModel):
    """An ORT session over the offline-optimized model."""

    def __init__(self, artifact_path: Path, threads: int | None, profile_dir: Path,
                 options: dict[str, Any] | None = None, overrides: dict[str, int] | None = None):
        import onnxruntime as ort

        self.artifact_path = artifact_path
        self.options = parse_compile_options(options)
        threads = self.options.get("threads") or threads
        self._requested_threads = threads
        self._profile_dir = profile_dir
        self._overrides = dict(overrides or {})
        self.session = ort.InferenceSession(
            str(artifact_path), self._session_options(), providers=["CPUExecutionProvider"]
        )
        static = self.options.get("static_shapes") or {}
        self.input_specs = [_spec(arg, static) for arg in self.session.get_inputs()]
        self.output_names = [arg.name for arg in self.session.get_outputs()]
        # ORT's default intra-op pool has one thread per physical core it may run on (its affinity mask).
        self.threads = threads or usable_cores()[0]

    def _session_options(self, *, profiling: bool = False):
        import onnxruntime as ort

        options = ort.SessionOptions()
        # The artifact was optimized at EXTENDED level, which keeps it valid on any CPU with this
        # EP; the layout transforms of ALL are machine-specific and are applied at load, exactly
        # as a deployment loading the artifact with default options would.
        options.graph_optimization_level = _level(ort, self.options.get("graph_optimization", "all"))
        for name, value in self._overrides.items():
            options.add_free_dimension_override_by_name(name, value)
        # A model that declares a wrong output shape (ddddocr's recognizer says [1, seqlen] and
        # returns [T, 1, C]) makes ORT warn on every run; failures still raise.
        options.log_severity_level = 3
        if self._requested_threads:
            options.intra_op_num_threads = self._requested_threads
        if profiling:
            options.enable_profiling = True
            options.profile_file_prefix = str(self._profile_dir / "ort-profile")
        return options

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = self.session.run(None, feeds)
        return dict(zip(self.output_names, outputs))

    def bind(self, feeds: dict[str, np.ndarray]) -> Callable[[], Any]:
        return functools.partial(self.session.run, None, feeds)

    def profile(self, feeds: dict[str, np.ndarray], runs: int = 10, warmup_runs: int = 1) -> dict:
        import onnxruntime as ort

        self._profile_dir.mkdir(parents=True, exist_ok=True)
        session = ort.InferenceSession(
            str(self.artifact_path),
            self._session_options(profiling=True),
            providers=["CPUExecutionProvider"],
        )
        # The profiler is on from the session's start, so warm-up runs are traced too and are
        # left out when the trace is read.
        for _ in range(warmup_runs + runs):
            session.run(None, feeds)
        trace_path = Path(session.end_profiling())
        try:
            return parse_ort_trace(json.loads(trace_path.read_text()), runs, warmup_runs=warmup_runs)
        finally:
            trace_path.unlink(missing_ok=True)

    def close(self) -> None:
        self.session = None


def parse_ort_trace(trace, runs: int, warmup_runs: int = 0) -> dict:
    """Summarize an ORT profiler trace (Chrome trace events) per node and per op type.

    The node events inside the first `warmup_runs` `model_run` windows are left out; a trace
    without timed `model_run` events is counted whole, over `runs + warmup_runs` runs.
    """
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    windows = sorted((event["ts"], event["ts"] + event.get("dur", 0)) for event in events
                     if event.get("cat") == "Session" and event.get("name") == "model_run" and "ts" in event)
    skipped = windows[:warmup_runs] if warmup_runs and len(windows) > warmup_runs else []
    node_times_ms: dict[str, float] = {}
    node_op_types: dict[str, str] = {}
    suffix = "_kernel_time"
    for event in events:
        name = event.get("name", "")
        if event.get("cat") != "Node" or not name.endswith(suffix):
            continue
        if any(start <= event.get("ts", -1) <= end for start, end in skipped):
            continue
        node = name[: -len(suffix)]
        node_times_ms[node] = node_times_ms.get(node, 0.0) + float(event.get("dur", 0)) / 1000.0
        node_op_types[node] = event.get("args", {}).get("op_name", "unknown")
    counted_runs = runs if skipped or not warmup_runs else runs + warmup_runs
    return summarize_profile(node_times_ms, node_op_types, counted_runs, warmup_runs=len(skipped))


class OnnxRuntimeBackend(Backend):
    """ONNX Runtime on the CPU execution provider."""

    name = "onnxruntime"

    def available(self) -> bool:
        try:
            import onnxruntime as ort
        except Exception:
            return False
        return "CPUExecutionProvider" in ort.get_available_providers()

    def version(self) -> str | None:
        if not self.available():
            return None
        import onnxruntime as ort

        return ort.__version__

    def operator_support(self, model_path: Path) -> dict:
        """ORT's node placement: each node of the unoptimized graph on the execution provider the partitioner gave it.
        A node on the preferred provider is native, on a later one a fallback; a node no provider implements fails
        the session, and ORT's message names it."""
        import onnxruntime as ort

        providers = ["CPUExecutionProvider"]
        facts = {"backend": self.name, "runtime": "ONNX Runtime", "version": ort.__version__, "device": providers[0],
                 "source": "InferenceSession node placement (session.record_ep_graph_assignment_info)"}
        options = ort.SessionOptions()
        # Unoptimized, so that the placement names the model's own nodes rather than ORT's fusions of them.
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 3
        options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        try:
            session = ort.InferenceSession(str(model_path), options, providers=providers)
        except Exception as exc:
            message = operator_support.first_lines(str(exc))
            return operator_support.answer(**facts, unsupported=_refused_nodes(message), refused=True,
                                  reason=f"ONNX Runtime {ort.__version__} cannot load the model: {message}")
        placement = getattr(session, "get_provider_graph_assignment_info", None)
        if placement is None:
            return operator_support.unknown(backend=self.name, runtime="ONNX Runtime", version=ort.__version__, device=providers[0],
                                   reason=f"ONNX Runtime {ort.__version__} loads the model but does not report node placement")
        native, fallback = [], []
        for subgraph in placement():
            nodes = [(node.name, node.op_type) for node in subgraph.get_nodes()]
            (native if subgraph.ep_name == providers[0] else fallback).extend(nodes)
        return operator_support.answer(**facts, native=native, fallback=fallback)

    def compile(
        self, model_path: str | Path, work_dir: str | Path, *, threads: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> OnnxRuntimeCompiledModel:
        import onnxruntime as ort

        compile_options = parse_compile_options(options)
        overrides = free_dimension_overrides(model_path, compile_options.get("static_shapes") or {})
        threads = compile_options.get("threads") or threads
        work_dir = Path(work_dir)
        work_dir.mkdir(parents=True, exist_ok=True)
        artifact_path = work_dir / ARTIFACT_NAME
        options = ort.SessionOptions()
        # The saved artifact never goes past EXTENDED (ALL's layouts are machine-specific), nor past
        # the level asked for: a lower level at load cannot undo fusions already saved.
        saved_level = "basic" if compile_options.get("graph_optimization") == "basic" else "extended"
        options.graph_optimization_level = _level(ort, saved_level)
        options.optimized_model_filepath = str(artifact_path)
        for name, value in overrides.items():
            options.add_free_dimension_override_by_name(name, value)
        if threads:
            options.intra_op_num_threads = threads
        # Creating the session is what writes the optimized model.
        ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        if not artifact_path.exists():
            raise RuntimeError(f"ONNX Runtime did not write the optimized model to {artifact_path}")
        return OnnxRuntimeCompiledModel(artifact_path, threads, work_dir, compile_options, overrides)
