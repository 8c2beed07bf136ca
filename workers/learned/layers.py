"""The learnable layers of a QDQ model: each Conv/Gemm/MatMul whose weight is a quantized initializer,
with ONNX Runtime's own scales, and the FP32 tensors around it gathered from the calibration set.

Learning works on the QDQ graph that calibration produced, so the learned integers use exactly the
scales, zero points and axes the runtime will use, and the variant keeps the graph (and the speed)
of calibrated INT8. Layers whose weight or tensors cannot be traced back to the FP32 model are
skipped with the reason.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

# The operators whose weights AdaRound, BRECQ and QAT learn (and the only parameters of the QAT student, torch_graph).
LEARNABLE_OPS = ("Conv", "Gemm", "MatMul")
QUANTIZED_SUFFIX = "_quantized"
# ORT renames a quantized node's output that is also a graph output.
RENAMED_OUTPUT_SUFFIX = "_QuantizeLinear_Input"


@dataclass
class QuantParams:
    scale: np.ndarray
    zero_point: np.ndarray
    qmin: int
    qmax: int
    axis: int | None = None


@dataclass
class Layer:
    """One learnable node: names in both graphs, its attributes, and the quantization around it."""

    node: str
    op_type: str
    attributes: dict
    input_name: str            # FP32 tensor feeding the node (before its QuantizeLinear)
    output_name: str           # the node's output, the same tensor name in the FP32 graph
    weight_name: str           # FP32 initializer
    quantized_weight_name: str  # integer initializer in the QDQ graph
    weight: QuantParams
    activation: QuantParams
    weight_scale_name: str = ""  # the weight's scale initializer in the QDQ graph
    quantized_input_name: str = ""  # the QDQ graph's DequantizeLinear output that the node reads: its input as deployed
    bias_name: str | None = None  # FP32 initializer
    quantized_bias_name: str | None = None  # int32 initializer in the QDQ graph, when the quantizer quantized the bias
    bias_scale_name: str | None = None
    skipped: str | None = None
    extra: dict = field(default_factory=dict)


def _integer_range(dtype: np.dtype, values: np.ndarray | None = None) -> tuple[int, int]:
    info = np.iinfo(dtype)
    if values is not None and dtype == np.int8 and values.size:
        # Symmetric weights use [-127, 127], or ONNX Runtime's reduced range [-64, 64] (its scale max|w| / 64).
        bound = int(np.abs(values.astype(np.int32)).max())
        if bound in (63, 64):
            return -64, 64
        return -127, 127
    return int(info.min), int(info.max)


def find_layers(qdq: onnx.ModelProto, fp32: onnx.ModelProto) -> list[Layer]:
    """Learnable layers of the QDQ model, in graph order; unusable ones carry `skipped`."""
    initializers = {tensor.name: tensor for tensor in qdq.graph.initializer}
    fp32_initializers = {tensor.name for tensor in fp32.graph.initializer}
    fp32_tensors = {output for node in fp32.graph.node for output in node.output} | {value.name for value in fp32.graph.input}
    fp32_producers = {output: node for node in fp32.graph.node for output in node.output}
    producers = {output: node for node in qdq.graph.node for output in node.output}
    layers = []
    for node in qdq.graph.node:
        if node.op_type not in LEARNABLE_OPS or len(node.input) < 2:
            continue
        weight_dq, input_dq = producers.get(node.input[1]), producers.get(node.input[0])
        if weight_dq is None or weight_dq.op_type != "DequantizeLinear" or weight_dq.input[0] not in initializers:
            continue  # kept in float, or a weight computed at run time: nothing to learn
        layer = _layer(node, weight_dq, input_dq, producers, initializers)
        if layer.weight_name not in fp32_initializers:
            layer.skipped = layer.skipped or f"its FP32 weight {layer.weight_name!r} is not in the model"
        elif layer.skipped is None and not {layer.input_name, layer.output_name} <= fp32_tensors:
            layer.skipped = "its input or output is not a tensor of the FP32 model (the quantizer rewrote the graph there)"
        elif layer.skipped is None and (problem := _fused_activation(layer, fp32_producers)):
            layer.skipped = problem
        elif layer.op_type == "Conv" and len(numpy_helper.to_array(initializers[layer.quantized_weight_name]).shape) not in (3, 4):
            layer.skipped = "only 1-D and 2-D convolutions are learned"
        layers.append(layer)
    return layers


def quantized_activations(qdq: onnx.ModelProto, fp32: onnx.ModelProto) -> dict[str, QuantParams]:
    """Every FP32 tensor the QDQ graph quantizes (QuantizeLinear then DequantizeLinear), with the scale calibration chose:
    the inputs of weight layers, and also those of activation-by-activation MatMuls and of any other quantized op."""
    initializers = {tensor.name: tensor for tensor in qdq.graph.initializer}
    fp32_tensors = {output for node in fp32.graph.node for output in node.output} | {value.name for value in fp32.graph.input}
    producers = {output: node for node in qdq.graph.node for output in node.output}
    found = {}
    for node in qdq.graph.node:
        quantize = producers.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
        if quantize is None or quantize.op_type != "QuantizeLinear" or node.input[0] in initializers:
            continue
        name = quantize.input[0].removesuffix(RENAMED_OUTPUT_SUFFIX)
        if name in fp32_tensors and name not in found and node.input[1] in initializers:
            found[name] = _params(node, initializers)
    return found


def quantized_initializers(qdq: onnx.ModelProto, fp32: onnx.ModelProto) -> dict[str, QuantParams]:
    """Every FP32 initializer the QDQ graph stores as integers (weights, int32 biases, of any op), with its scale, zero
    point and axis: what the runtime computes with in its place."""
    initializers = {tensor.name: tensor for tensor in qdq.graph.initializer}
    fp32_initializers = {tensor.name for tensor in fp32.graph.initializer}
    found = {}
    for node in qdq.graph.node:
        if node.op_type != "DequantizeLinear" or node.input[0] not in initializers or node.input[1] not in initializers:
            continue
        name = node.input[0].removesuffix(QUANTIZED_SUFFIX)
        if name != node.input[0] and name in fp32_initializers:
            found[name] = _params(node, initializers, numpy_helper.to_array(initializers[node.input[0]]))
    return found


def _fused_activation(layer: Layer, fp32_producers: dict) -> str | None:
    """ONNX Runtime's QDQ quantizer folds a Relu into the node before it (the output takes the Relu's name);
    the layer then computes the Relu too. Returns why the layer cannot be learned, or None."""
    producer = fp32_producers.get(layer.output_name)
    if producer is None or producer.op_type == layer.op_type:
        return None
    if producer.op_type == "Relu":
        layer.extra["activation"] = "relu"
        return None
    return f"its output {layer.output_name!r} comes from a folded {producer.op_type}"


def _params(node: onnx.NodeProto, initializers: dict, values: np.ndarray | None = None) -> QuantParams:
    scale = numpy_helper.to_array(initializers[node.input[1]]).astype(np.float32)
    if len(node.input) > 2 and node.input[2] in initializers:
        zero_point = numpy_helper.to_array(initializers[node.input[2]])
    else:
        zero_point = np.zeros_like(scale, dtype=np.uint8)
    axis = next((attribute.i for attribute in node.attribute if attribute.name == "axis"), 1) if scale.size > 1 else None
    qmin, qmax = _integer_range(zero_point.dtype, values)
    return QuantParams(scale=scale, zero_point=zero_point.astype(np.int32), qmin=qmin, qmax=qmax, axis=axis)


def _layer(node, weight_dq, input_dq, producers, initializers) -> Layer:
    quantized_name = weight_dq.input[0]
    weight_values = numpy_helper.to_array(initializers[quantized_name])
    attributes = {attribute.name: helper.get_attribute_value(attribute) for attribute in node.attribute}
    bias_name = quantized_bias_name = bias_scale_name = None
    if len(node.input) > 2 and node.input[2]:
        bias_dq = producers.get(node.input[2])
        if bias_dq is not None and bias_dq.op_type == "DequantizeLinear":
            quantized_bias_name, bias_scale_name = bias_dq.input[0], bias_dq.input[1]
            bias_name = quantized_bias_name.removesuffix(QUANTIZED_SUFFIX)
        else:
            bias_name = node.input[2]
    skipped = None
    input_name = quantized_input_name = node.input[0]
    activation = QuantParams(scale=np.ones(1, np.float32), zero_point=np.zeros(1, np.int32), qmin=0, qmax=255)
    if input_dq is None or input_dq.op_type != "DequantizeLinear":
        skipped = "its input is not quantized"
    else:
        quantize = producers.get(input_dq.input[0])
        if quantize is None or quantize.op_type != "QuantizeLinear":
            skipped = "its input's QuantizeLinear was not found"
        else:
            input_name = quantize.input[0]
            activation = _params(input_dq, initializers)
    return Layer(
        node=node.name or node.output[0], op_type=node.op_type, attributes=attributes,
        input_name=input_name.removesuffix(RENAMED_OUTPUT_SUFFIX), output_name=node.output[0].removesuffix(RENAMED_OUTPUT_SUFFIX),
        weight_name=quantized_name.removesuffix(QUANTIZED_SUFFIX), quantized_weight_name=quantized_name,
        weight=_params(weight_dq, initializers, weight_values), activation=activation, weight_scale_name=weight_dq.input[1],
        quantized_input_name=quantized_input_name,
        bias_name=bias_name, quantized_bias_name=quantized_bias_name, bias_scale_name=bias_scale_name, skipped=skipped,
    )


class TensorReader:
    """One ONNX Runtime session over a model (the FP32 one, or a QDQ graph as it is deployed) that reads any of `names`
    and takes new values for the `overridable` initializers at each run, so that learning reads tensors pass after pass
    without building a session each time."""

    def __init__(self, source: Path | onnx.ModelProto, names, overridable=()):
        import onnxruntime as ort

        model = onnx.load(str(source)) if isinstance(source, Path | str) else copy.deepcopy(source)
        present = {output.name for output in model.graph.output}
        for name in names:
            if name not in present:
                model.graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
                present.add(name)
        initializers = {tensor.name: tensor for tensor in model.graph.initializer}
        for name in overridable:
            # An initializer that is also a graph input takes a fed value in its place.
            model.graph.input.append(helper.make_tensor_value_info(name, initializers[name].data_type, list(initializers[name].dims)))
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        # Optimizations could fuse away the very tensors asked for, or fold the initializers to be overridden.
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        self.session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        self.overridable = set(overridable)
        self.feeds = {i.name for i in self.session.get_inputs()} - self.overridable

    def read(self, names: list[str], feeds_batches: list[dict[str, np.ndarray]], overrides: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """`names` over the batches, concatenated; `overrides`: values for overridable initializers (dtypes kept)."""
        fed = {name: np.asarray(value) for name, value in (overrides or {}).items() if name in self.overridable}
        gathered: dict[str, list[np.ndarray]] = {name: [] for name in names}
        for feeds in feeds_batches:
            values = self.session.run(names, {**{k: v for k, v in feeds.items() if k in self.feeds}, **fed})
            for name, value in zip(names, values, strict=True):
                gathered[name].append(np.asarray(value, dtype=np.float32))
        return {name: np.concatenate(parts) for name, parts in gathered.items()}


def gather_tensors(source: Path | onnx.ModelProto, names: list[str], feeds_batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Run a model with `names` as extra outputs over the batches; returns them concatenated."""
    return TensorReader(source, names).read(names, feeds_batches)


def fp32_weights(fp32: onnx.ModelProto, names: list[str]) -> dict[str, np.ndarray]:
    wanted = set(names)
    return {tensor.name: numpy_helper.to_array(tensor).astype(np.float32) for tensor in fp32.graph.initializer if tensor.name in wanted}


def replace_integer_weights(qdq: onnx.ModelProto, learned: dict[str, np.ndarray]) -> None:
    """Write learned values over the QDQ model's initializers of the same names, keeping their dtypes and shapes."""
    for index, tensor in enumerate(qdq.graph.initializer):
        if tensor.name in learned:
            dtype = numpy_helper.to_array(tensor).dtype
            value = np.asarray(learned[tensor.name]).astype(dtype).reshape(tuple(tensor.dims))
            qdq.graph.initializer[index].CopyFrom(numpy_helper.from_array(value, tensor.name))


def quantize_bias(bias: np.ndarray, input_scale: np.ndarray, weight_scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int32 bias, its scale) as ONNX Runtime's QDQ quantizer computes them: scale = input scale x weight scale (float32),
    the bias divided in float64, rounded half to even and clipped to int32."""
    scale = (np.asarray(input_scale, np.float32).reshape(-1) * np.asarray(weight_scale, np.float32).reshape(-1)).astype(np.float32)
    info = np.iinfo(np.int32)
    integers = np.clip(np.round(np.asarray(bias, np.float64) / scale.astype(np.float64)), info.min, info.max).astype(np.int32)
    return integers, scale


def write_tuned_weights(qdq: onnx.ModelProto, fp32: onnx.ModelProto, layers: list[Layer],
                        quantized: dict[str, tuple[np.ndarray, np.ndarray]], floats: dict[str, np.ndarray]) -> None:
    """Write fine-tuned weights into the calibrated QDQ graph, leaving every activation's QuantizeLinear/DequantizeLinear
    (scale, zero point) as calibration chose. `quantized`: FP32 weight name -> (integers, scale) of a layer's weight,
    written as its integer initializer and its scale; a quantized bias is requantized at input scale x the new weight
    scale from the FP32 bias. `floats`: initializers the QDQ graph keeps in float, written as they are."""
    biases = fp32_weights(fp32, [layer.bias_name for layer in layers if layer.quantized_bias_name])
    initializers = {tensor.name: tensor for tensor in qdq.graph.initializer}
    for layer in layers:
        if layer.quantized_bias_name and layer.bias_name not in biases:  # not an FP32 initializer: the stored one, dequantized
            stored, scale = (numpy_helper.to_array(initializers[name]) for name in (layer.quantized_bias_name, layer.bias_scale_name))
            biases[layer.bias_name] = stored.astype(np.float64) * scale.astype(np.float64)
    values = dict(floats)
    for layer in layers:
        if layer.weight_name not in quantized:
            continue
        integers, scale = quantized[layer.weight_name]
        values[layer.quantized_weight_name], values[layer.weight_scale_name] = integers, scale
        if layer.quantized_bias_name:
            values[layer.quantized_bias_name], values[layer.bias_scale_name] = quantize_bias(biases[layer.bias_name], layer.activation.scale, scale)
    replace_integer_weights(qdq, values)
