"""OpenVINO (CPU plugin) backend."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from devices.artifacts import OPENVINO_IR, artifact_format, read_openvino_ir
from devices.backends.base import Backend, CompiledModel, TensorSpec, model_layer_names, summarize_profile
from devices.backends.options import parse_compile_options
from kiln_contract import operator_support

logger = logging.getLogger(__name__)

ARTIFACT_NAME = "model.openvino.blob"
DEVICE = "CPU"
# Graph plumbing every model has; operator support is about the operations between them.
STRUCTURAL_OPS = frozenset({"Parameter", "Result", "Constant"})
# The operations whose subgraphs may hold what a runtime refuses.
CONTROL_FLOW = ("Loop", "Scan", "If")


def _unconverted_operations(message: str) -> list[str]:
    """The ONNX operation types OpenVINO's frontend names after "No conversion rule found for operations:" (`util::` dropped)."""
    found = re.search(r"No conversion rule found for operations:\s*([^\n]*?)(?:\s+--|$)", message)
    if not found:
        return []
    return [name.strip().split("::")[-1] for name in found.group(1).split(",") if name.strip()]


def containers(model_path: Path, op_types: set[str], message: str = "") -> list[str]:
    """The top-level nodes (a Loop, If or Scan) whose subgraphs hold any of `op_types`, as "Loop 'decoder'"; when a
    runtime's message names no operation but speaks of a loop (a scan, an if), the model's nodes of that kind."""
    import onnx

    def inner_types(graph) -> set[str]:
        found = set()
        for node in graph.node:
            found.add(node.op_type)
            for attribute in node.attribute:
                for subgraph in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs):
                    found |= inner_types(subgraph)
        return found

    try:
        graph = onnx.load(str(model_path), load_external_data=False).graph
    except Exception:
        return []
    named = []
    spoken_of = {kind for kind in CONTROL_FLOW if re.search(rf"\b{kind}", message, re.IGNORECASE)}
    for node in graph.node:
        subgraphs = [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
        subgraphs += [g for a in node.attribute for g in a.graphs]
        holds = subgraphs and set().union(*(inner_types(g) for g in subgraphs)) & op_types
        if holds or (subgraphs and not op_types and node.op_type in spoken_of):
            named.append(f"{node.op_type} {(node.name or node.output[0])!r}")
    return named


# Operations whose presence makes a model quantized for OpenVINO: FakeQuantize (an NNCF IR, or a QDQ ONNX file as
# OpenVINO reads it) and the integer constants of compressed weights (decompressed by Convert, Subtract, Multiply).
QUANTIZED_OPS = frozenset({"FakeQuantize"})
QUANTIZED_WEIGHT_TYPES = frozenset({"u8", "i8", "u4", "i4", "nf4"})


# OpenVINO's element types as the labels (kiln_contract.labels) name precisions.
FLOAT_PRECISION_NAMES = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}



def is_quantized(model) -> bool:
    """Whether an OpenVINO model holds quantized operations or integer-compressed weights."""
    return any(op.get_type_name() in QUANTIZED_OPS or _compressed_weight(op) for op in model.get_ordered_ops())


def _compressed_weight(op) -> bool:
    # A compressed weight is an 8- or 4-bit constant decompressed by a Convert; an integer lookup table
    # (a Gather's data) is not, and an FP32 model holding one must keep its f32 hint.
    if op.get_type_name() != "Constant" or op.get_output_element_type(0).get_type_name() not in QUANTIZED_WEIGHT_TYPES:
        return False
    return any(target.get_node().get_type_name() == "Convert" for target in op.output(0).get_target_inputs())


def _config(threads: int | None, *, options: dict[str, Any] | None = None, quantized: bool = False) -> dict:
    # The benchmark reports per-request latency, which is what the LATENCY hint optimizes.
    # On CPUs with bf16 or fp16 units the plugin would otherwise quietly run an FP32 model in
    # lower precision; precision is the variant's business (or a compile option the search measured
    # for accuracy like any variant), so by default an FP32 artifact runs as built. A quantized model
    # gets no precision hint: forcing f32 makes OpenVINO's CPU plugin skip its low-precision
    # transformations for the float remainder and runs an INT8 model several times slower (3.6x on
    # a text detector), while the plugin's default runs the INT8 kernels NNCF's FakeQuantize nodes
    # ask for (the remainder in the CPU's default float precision: bf16 where it has bf16 units). Where that default is
    # bf16, f32 for the remainder is a compile option the search measures (`ov-f32`): it can also be the faster one
    # (NudeNet's INT8 IR, 2026-12-07: 11.4 ms in f32 against 12.6 ms in the default).
    options = options or {}
    config: dict[str, Any] = {"PERFORMANCE_HINT": options.get("performance_hint", "LATENCY")}
    hint = options.get("inference_precision") or (None if quantized else "f32")
    if hint:
        config["INFERENCE_PRECISION_HINT"] = hint
    threads = options.get("threads") or threads
    if threads:
        config["INFERENCE_NUM_THREADS"] = int(threads)
    return config


def compile_model(core, model, threads: int | None, options: dict[str, Any]):
    """The model compiled for the CPU plugin, and the config it was compiled with (a quantized one without a precision hint)."""
    quantized = is_quantized(model)
    config = _config(threads, options=options, quantized=quantized)
    try:
        return core.compile_model(model, DEVICE, config), config
    except RuntimeError as error:
        if not quantized or "INFERENCE_PRECISION_HINT" in config:
            raise
        # OpenVINO 2026.4's CPU plugin finds no kernel ("No suitable implementations") for QDQ graphs with signed
        # 8-bit activations (quantize_static's defaults) in its bf16 default; in f32 they compile and run in INT8.
        logger.info("quantized model does not compile in the CPU plugin's default precision, compiling in f32: %s",
                    operator_support.first_lines(str(error)))
        config = {**config, "INFERENCE_PRECISION_HINT": "f32"}
        return core.compile_model(model, DEVICE, config), config


def read_artifact(core, model_path: str | Path):
    """OpenVINO's model of an artifact: a packed IR read from memory, or an ONNX file through OpenVINO's ONNX frontend."""
    import openvino as ov

    if artifact_format(model_path) == OPENVINO_IR:
        xml, weights = read_openvino_ir(model_path)
        # ov.Tensor copies the array (shared_memory defaults to False): the model never points into `weights`.
        return core.read_model(xml, ov.Tensor(np.frombuffer(weights, dtype=np.uint8)))
    return core.read_model(str(model_path))


def _declared_names(core, model_path: Path) -> tuple[set[str], set[str]]:
    """The model's own input and output names: the ONNX graph's (weights are not read), or the IR's ports'."""
    if artifact_format(model_path) == OPENVINO_IR:
        model = read_artifact(core, model_path)
        return ({name for port in model.inputs for name in port.get_names()},
                {name for port in model.outputs for name in port.get_names()})
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    initializers = {tensor.name for tensor in graph.initializer}
    return {v.name for v in graph.input if v.name not in initializers}, {v.name for v in graph.output}


def _port_name(port, declared: set[str]) -> str:
    """The port's name as the ONNX model declares it.

    A port can carry several tensor names once OpenVINO fuses nodes: an FP16 model's input Cast
    (`graph_input_cast_0`) merges into the parameter, and `get_any_name()` may pick that one.
    """
    names = port.get_names()
    return next((name for name in sorted(names) if name in declared), port.get_any_name())


def _spec(port, declared: set[str]) -> TensorSpec:
    partial_shape = port.get_partial_shape()
    shape = tuple(
        dim.get_length() if dim.is_static else None for dim in partial_shape
    ) if partial_shape.rank.is_static else ()
    return TensorSpec(
        name=_port_name(port, declared), dtype=np.dtype(port.get_element_type().to_dtype()), shape=shape
    )


def _owned_tensor(ov, array: np.ndarray):
    """A tensor with its own memory holding a copy of `array`.

    `ov.Tensor(array)` corrupted the heap (glibc "unaligned tcache chunk" aborts, later, in
    unrelated allocations) when `array` was a view into a larger array, such as the first rows
    of a validation set; numpy copying into OpenVINO-allocated memory is safe.
    """
    array = np.asarray(array)
    tensor = ov.Tensor(ov.Type(array.dtype), ov.Shape(list(array.shape)))
    tensor.data[...] = array
    return tensor


def read_specialised(core, model_path: Path, options: dict[str, Any]):
    """The artifact read by OpenVINO, reshaped to the static shapes the options name."""
    model = read_artifact(core, model_path)
    static = options.get("static_shapes") or {}
    if static:
        declared, _ = _declared_names(core, model_path)
        unknown = sorted(set(static) - declared)
        if unknown:
            raise ValueError(f"static_shapes names no input of the model: {', '.join(unknown)}")
        model.reshape({name: dims for name, dims in static.items()})
    return model


def _original_layers(compiled) -> dict[str, list[str]]:
    """Per node of the compiled (runtime) model, the model's own nodes it runs, from OpenVINO's originalLayersNames."""
    layers: dict[str, list[str]] = {}
    try:
        for op in compiled.get_runtime_model().get_ordered_ops():
            info = op.get_rt_info()
            if "originalLayersNames" in info:
                names = model_layer_names(info["originalLayersNames"].astype(str).split(","))
                if names:
                    layers[op.get_friendly_name()] = names
    except (RuntimeError, AttributeError):
        # An older OpenVINO without the runtime model's rt_info: the runtime's own names stay.
        return {}
    return layers


class OpenVinoCompiledModel(CompiledModel):
    """A compiled model imported from the exported blob."""

    def __init__(self, core, source_model_path: Path, artifact_path: Path, config: dict[str, Any],
                 options: dict[str, Any] | None = None):
        self._core = core
        self._source_model_path = source_model_path
        # The config the blob was compiled with: profiling compiles the same model the same way.
        self._config = dict(config)
        self.options = parse_compile_options(options)
        self.artifact_path = artifact_path
        # Run what was exported, so that a broken blob fails here and not in a deployment.
        self.compiled = core.import_model(artifact_path.read_bytes(), DEVICE, self._config)
        self.request = self.compiled.create_infer_request()
        declared_inputs, declared_outputs = _declared_names(core, source_model_path)
        self.input_specs = [_spec(port, declared_inputs) for port in self.compiled.inputs]
        self.output_names = [_port_name(port, declared_outputs) for port in self.compiled.outputs]
        self.threads = int(self.compiled.get_property("INFERENCE_NUM_THREADS"))
        # Without a hint (a quantized model) the plugin picks the float precision itself: say which it took.
        precision = self.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        self.float_precision = FLOAT_PRECISION_NAMES.get(precision, precision)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results = self.request.infer(feeds)
        return {
            name: np.array(results[port], copy=True)
            for name, port in zip(self.output_names, self.compiled.outputs)
        }

    def bind(self, feeds: dict[str, np.ndarray]) -> Callable[[], Any]:
        """Bound to the model's single infer request: valid until the next bind() or run()."""
        import openvino as ov

        # One request serves run() and every bound call: they never overlap, and extra requests
        # on a dynamic-shape model were part of heap corruption seen in tests.
        request = self.request
        for name, array in feeds.items():
            request.set_tensor(name, _owned_tensor(ov, array))
        return request.infer

    def profile(self, feeds: dict[str, np.ndarray], runs: int = 10, warmup_runs: int = 1) -> dict:
        # Performance counters must be enabled at compile time and slow every inference down a
        # little, so they get their own compiled model instead of the benchmarked one.
        model = read_specialised(self._core, self._source_model_path, self.options)
        compiled = self._core.compile_model(model, DEVICE, {**self._config, "PERF_COUNT": True})
        request = compiled.create_infer_request()
        node_times_ms: dict[str, float] = {}
        node_op_types: dict[str, str] = {}
        # Profiling info describes the last inference only, so warm-up runs are simply not read.
        for _ in range(warmup_runs):
            request.infer(feeds)
        for _ in range(runs):
            request.infer(feeds)
            for info in request.get_profiling_info():
                if info.status != info.Status.EXECUTED:
                    continue
                time_ms = info.real_time.total_seconds() * 1000.0
                node_times_ms[info.node_name] = node_times_ms.get(info.node_name, 0.0) + time_ms
                node_op_types[info.node_name] = info.node_type
        return summarize_profile(node_times_ms, node_op_types, runs, warmup_runs=warmup_runs, node_layers=_original_layers(compiled))

    def close(self) -> None:
        self.request = None
        self.compiled = None


class OpenVinoBackend(Backend):
    """OpenVINO on the CPU plugin."""

    name = "openvino"

    def available(self) -> bool:
        try:
            import openvino as ov

            return DEVICE in ov.Core().available_devices
        except Exception:
            return False

    def version(self) -> str | None:
        if not self.available():
            return None
        import openvino as ov

        # "2026.4.1-22982-e213a147257-releases/2026/4" -> "2026.4.1"
        return ov.get_version().split("-")[0]

    def operator_support(self, model_path: Path) -> dict:
        """OpenVINO's reader, then `core.query_model` on the CPU plugin: an operation the plugin does not list cannot run
        (the CPU plugin has no fallback device); a model the reader refuses cannot run at all, and the reason names the
        operations it found no conversion rule for and the Loop (If, Scan) that holds them."""
        import openvino as ov

        version = ov.get_version().split("-")[0]
        facts = {"backend": self.name, "runtime": "OpenVINO", "version": version, "device": DEVICE,
                 "source": "core.read_model + core.query_model"}
        core = ov.Core()
        try:
            model = read_artifact(core, model_path)
        except Exception as exc:
            message = operator_support.first_lines(str(exc))
            refused = _unconverted_operations(message)
            where = containers(Path(model_path), set(refused), message)
            inside = f" (inside {', '.join(where)})" if where else ""
            nodes = [(where[0] if where else op, op) for op in refused] or [(node, node.split(" ", 1)[0]) for node in where]
            return operator_support.answer(**facts, unsupported=nodes, refused=True,
                                  reason=f"OpenVINO {version} cannot read the model{inside}: {message}")
        supported = core.query_model(model, DEVICE)
        native, unsupported = [], []
        for op in model.get_ordered_ops():
            if op.get_type_name() in STRUCTURAL_OPS:
                continue
            (native if op.get_friendly_name() in supported else unsupported).append((op.get_friendly_name(), op.get_type_name()))
        reason = f"the OpenVINO {version} CPU plugin does not run {', '.join(sorted({t for _, t in unsupported}))}" if unsupported else None
        return operator_support.answer(**facts, native=native, unsupported=unsupported, reason=reason)

    def compile(
        self, model_path: str | Path, work_dir: str | Path, *, threads: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> OpenVinoCompiledModel:
        import openvino as ov

        compile_options = parse_compile_options(options)
        work_dir = Path(work_dir)
        work_dir.mkdir(parents=True, exist_ok=True)
        core = ov.Core()
        model = read_specialised(core, Path(model_path), compile_options)
        compiled, config = compile_model(core, model, threads, compile_options)
        artifact_path = work_dir / ARTIFACT_NAME
        exported = compiled.export_model()
        # Recent releases return an io.BytesIO, older ones bytes.
        artifact_path.write_bytes(exported.getvalue() if hasattr(exported, "getvalue") else exported)
        del compiled
        return OpenVinoCompiledModel(core, Path(model_path), artifact_path, config, compile_options)
