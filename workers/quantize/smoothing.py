"""SmoothQuant-style equalization: an exact float rewrite that moves activation outliers into the weights before INT8.

A Gemm/MatMul input with a few channels far larger than the rest (found on the calibration set) gets a per-tensor
activation scale that is too coarse for every other channel. Dividing input channel j by s_j and multiplying the
weight's row j by s_j leaves the product unchanged, (x / s) · (s · W) = x · W; with SmoothQuant's
s_j = max|X_j|^α / max|W_j|^(1-α) (Xiao et al., 2023) the activation channels come closer together at the cost of
wider weight rows, which are quantized per output channel. The 1/s goes into the producer where that is linear per
channel (LayerNormalization's gamma and beta, a Gemm/MatMul's output columns and bias, a bias Add after a MatMul);
otherwise a Mul by the constant 1/s is inserted in front of the consumers.

α is chosen per tensor from a grid by the consumers' simulated INT8 output error on calibration activations
(per-tensor uint8 activations over the range MSE calibration would choose, per-output-channel int8 weights); a tensor where no α beats
leaving it alone is left alone. onnxruntime's own `extra_options={"SmoothQuant": True}` needs Intel Neural
Compressor, which Kiln does not install; NNCF's SmoothQuant only runs inside `nncf.quantize` (the `tool="nncf"` family).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from workers.datasets import dataset_samples
from workers.quantize.calibration_methods import ActivationTap, Histogram, mse_range

DEFAULT_ALPHAS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0)
# max channel / median channel of max|x| from which a tensor is worth trying (the MiniLM GELU outlier: ~23).
DEFAULT_MIN_OUTLIER_RATIO = 4.0
DEFAULT_SAMPLES = 32
# Activation rows kept per tensor for the α search (rows of the [rows, channels] view), spread over the samples.
MAX_ROWS = 2048
MIN_SCALE = 1e-5


@dataclass
class Consumer:
    """A Gemm/MatMul that reads the smoothed tensor as its left operand, and its constant weight."""

    node: onnx.NodeProto
    weight_name: str
    transposed: bool  # Gemm transB: the weight is [N, K] rather than [K, N]


@dataclass
class SmoothingResult:
    model: onnx.ModelProto
    tensors: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        smoothed = [t for t in self.tensors if t["alpha"] is not None]
        return {"method": "smoothquant (kiln)", "smoothed": len(smoothed), "considered": len(self.tensors), "tensors": self.tensors}


class _Graph:
    """Lookups over a model being rewritten: producers, consumers, constants."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.initializers = {tensor.name: tensor for tensor in model.graph.initializer}
        self.constant_nodes = {node.output[0]: node for node in model.graph.node if node.op_type == "Constant"}
        self.producers = {output: node for node in model.graph.node for output in node.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in model.graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.outputs = {value.name for value in model.graph.output}
        self._fresh = 0

    def constant(self, name: str) -> np.ndarray | None:
        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name])
        node = self.constant_nodes.get(name)
        if node is not None and node.attribute and node.attribute[0].name == "value":
            return numpy_helper.to_array(node.attribute[0].t)
        return None

    def add_constant(self, base: str, value: np.ndarray) -> str:
        """A new initializer (never an edit of one other nodes may share)."""
        self._fresh += 1
        name = f"{base}.smooth{self._fresh}"
        tensor = numpy_helper.from_array(np.ascontiguousarray(value), name)
        self.model.graph.initializer.append(tensor)
        self.initializers[name] = tensor  # a later fold may scale this weight again (a Gemm both reads and makes a smoothed tensor)
        return name


def attributes(node: onnx.NodeProto) -> dict[str, Any]:
    return {attribute.name: helper.get_attribute_value(attribute) for attribute in node.attribute}


def smoothable_inputs(model: onnx.ModelProto) -> dict[str, list[Consumer]]:
    """Tensors read only by Gemm/MatMul nodes as their left operand with a constant 2-D weight (where smoothing is exact)."""
    graph = _Graph(model)
    found: dict[str, list[Consumer]] = {}
    for name, readers in graph.consumers.items():
        if name in graph.initializers or name in graph.constant_nodes or name in graph.outputs:
            continue
        consumers = [_consumer(graph, node, name) for node in readers]
        if consumers and all(consumer is not None for consumer in consumers):
            found[name] = consumers  # type: ignore[assignment]
    return found


def _consumer(graph: _Graph, node: onnx.NodeProto, tensor: str) -> Consumer | None:
    if node.op_type not in ("Gemm", "MatMul") or len(node.input) < 2 or node.input[0] != tensor or node.input[1] == tensor:
        return None
    weight = graph.constant(node.input[1])
    if weight is None or weight.ndim != 2 or weight.dtype != np.float32:
        return None
    options = attributes(node)
    if node.op_type == "Gemm" and options.get("transA", 0):
        return None
    return Consumer(node=node, weight_name=node.input[1], transposed=bool(node.op_type == "Gemm" and options.get("transB", 0)))


def weight_rows(weight: np.ndarray, transposed: bool) -> np.ndarray:
    """The weight as [input channels, outputs]."""
    return weight.T if transposed else weight


def outlier_ratio(channel_absmax: np.ndarray) -> float:
    """Largest channel's max|x| over the median channel's: how much a per-tensor scale wastes on the typical channel."""
    return float(channel_absmax.max() / max(float(np.median(channel_absmax)), 1e-12))


def smoothing_scales(activation_absmax: np.ndarray, weight_absmax: np.ndarray, alpha: float) -> np.ndarray:
    """SmoothQuant's per-input-channel s = max|X_j|^α / max|W_j|^(1-α), finite and positive."""
    scales = np.power(np.maximum(activation_absmax, MIN_SCALE), alpha) / np.power(np.maximum(weight_absmax, MIN_SCALE), 1.0 - alpha)
    return np.clip(scales, MIN_SCALE, 1.0 / MIN_SCALE).astype(np.float32)


def collect_activations(model_path: Path, calibration_path: str | Path, names: list[str], *, samples: int,
                        max_rows: int = MAX_ROWS, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Per tensor: max|x| per channel (last axis) over the calibration samples, and up to `max_rows` rows of [rows, channels]."""
    rng = np.random.default_rng(seed)
    absmax: dict[str, np.ndarray] = {}
    rows: dict[str, list[np.ndarray]] = {name: [] for name in names}
    samples = min(dataset_samples(calibration_path), samples)
    with ActivationTap(model_path, tensor_names=names) as tap:
        for _, activations in tap.stream(calibration_path, batch_size=8, limit=samples):
            for name in names:
                value = np.asarray(activations[name], dtype=np.float32)
                flat = value.reshape(-1, value.shape[-1])
                peak = np.abs(flat).max(axis=0)
                absmax[name] = np.maximum(absmax[name], peak) if name in absmax else peak
                keep = max(1, max_rows * 8 // max(samples, 1))
                rows[name].append(flat[rng.choice(len(flat), size=min(keep, len(flat)), replace=False)])
    return absmax, {name: np.concatenate(parts)[:max_rows] for name, parts in rows.items() if parts}


def quantize_activation(x: np.ndarray) -> np.ndarray:
    """Per-tensor uint8 asymmetric fake quantization over the range that MSE calibration (`mse_range`) chooses for x."""
    low, high, _ = mse_range(Histogram.from_values(x))
    scale = max((high - low) / 255.0, 1e-12)
    zero = np.round(-low / scale)
    return (np.clip(np.round(x / scale) + zero, 0, 255) - zero) * scale


def _quantize_weight(rows: np.ndarray) -> np.ndarray:
    """Per-output-channel symmetric int8 fake quantization of a [inputs, outputs] weight."""
    scale = np.maximum(np.abs(rows).max(axis=0, keepdims=True), 1e-12) / 127.0
    return np.clip(np.round(rows / scale), -127, 127) * scale


def simulated_error(x: np.ndarray, weights: list[np.ndarray], scales: np.ndarray | None) -> float:
    """Relative squared error of the consumers' outputs when x / s and s · W are quantized, against x · W in float."""
    inverse = 1.0 if scales is None else 1.0 / scales
    column = 1.0 if scales is None else scales[:, None]
    quantized_x = quantize_activation(x * inverse)
    total = 0.0
    for rows in weights:
        reference = x @ rows
        total += float(np.sum((quantized_x @ _quantize_weight(rows * column) - reference) ** 2) / max(float(np.sum(reference ** 2)), 1e-20))
    return total / len(weights)


def smooth_model(model_path: str | Path, calibration_path: str | Path, *, alphas: tuple[float, ...] = DEFAULT_ALPHAS,
                 min_outlier_ratio: float = DEFAULT_MIN_OUTLIER_RATIO, samples: int = DEFAULT_SAMPLES) -> SmoothingResult:
    """The model with every outlier-channel Gemm/MatMul input smoothed at its best α (the same function in float)."""
    model = onnx.load(str(model_path))
    candidates = smoothable_inputs(model)
    if not candidates:
        return SmoothingResult(model=model)
    absmax, rows = collect_activations(Path(model_path), calibration_path, sorted(candidates), samples=samples)
    graph = _Graph(model)
    result = SmoothingResult(model=model)
    for tensor in sorted(candidates, key=lambda name: -outlier_ratio(absmax[name])):
        ratio = outlier_ratio(absmax[tensor])
        if ratio < min_outlier_ratio:
            continue
        consumers = candidates[tensor]
        weights = [weight_rows(graph.constant(c.weight_name).astype(np.float32), c.transposed) for c in consumers]
        weight_absmax = np.max([np.abs(w).max(axis=1) for w in weights], axis=0)
        errors = {None: simulated_error(rows[tensor], weights, None)}
        for alpha in alphas:
            errors[alpha] = simulated_error(rows[tensor], weights, smoothing_scales(absmax[tensor], weight_absmax, alpha))
        alpha = min(errors, key=lambda key: errors[key])
        entry = {"tensor": tensor, "consumers": [c.node.name for c in consumers], "outlier_ratio": round(ratio, 2),
                 "error_unsmoothed": round(errors[None], 6), "alpha": alpha, "error": round(errors[alpha], 6)}
        if alpha is not None:
            scales = smoothing_scales(absmax[tensor], weight_absmax, alpha)
            entry["folded_into"] = apply_smoothing(graph, tensor, consumers, scales)
            entry["outlier_ratio_after"] = round(outlier_ratio(absmax[tensor] / scales), 2)
        result.tensors.append(entry)
    _drop_unused_initializers(model)
    return result


def apply_smoothing(graph: _Graph, tensor: str, consumers: list[Consumer], scales: np.ndarray) -> str:
    """Scale the consumers' weight rows by s and divide `tensor` by s: folded into its producer, or by an inserted Mul.
    Returns the node that took 1/s."""
    for consumer in consumers:
        weight = graph.constant(consumer.weight_name)
        scaled = weight * scales[None, :] if consumer.transposed else weight * scales[:, None]
        consumer.node.input[1] = graph.add_constant(consumer.weight_name, scaled.astype(np.float32))
    inverse = (1.0 / scales).astype(np.float32)
    edits = _fold_plan(graph, tensor, inverse, allowed={id(c.node) for c in consumers}, depth=0)
    if edits is not None:
        for node, index, base, value in edits:
            node.input[index] = graph.add_constant(base, value)
        return edits[0][0].name if edits else ""
    return _insert_mul(graph, tensor, consumers, inverse)


# (node, input index, name to derive the new constant's name from, new value)
Edit = tuple[onnx.NodeProto, int, str, np.ndarray]
MAX_FOLD_DEPTH = 4


def _fold_plan(graph: _Graph, tensor: str, inverse: np.ndarray, *, allowed: set[int], depth: int) -> list[Edit] | None:
    """Edits that divide `tensor`'s last axis by s inside its producer, or None when the producer is not linear per channel
    (or its output is read by anyone else, who would see the change)."""
    producer = graph.producers.get(tensor)
    readers = graph.consumers.get(tensor, [])
    if producer is None or depth > MAX_FOLD_DEPTH or tensor in graph.outputs or any(id(node) not in allowed for node in readers):
        return None
    op = producer.op_type
    if op == "LayerNormalization" and attributes(producer).get("axis", -1) == -1 and len(producer.input) >= 2:
        return _scale_constants(graph, producer, [1, 2], inverse)
    if op in ("Gemm", "MatMul"):
        return _fold_into_linear(graph, producer, inverse)
    if op == "Add":
        # A bias after a MatMul (exporters often split Gemm so): fold into both.
        constant_at = [index for index, name in enumerate(producer.input[:2]) if graph.constant(name) is not None]
        if len(constant_at) == 1:
            variable = producer.input[1 - constant_at[0]]
            upstream = _fold_plan(graph, variable, inverse, allowed={id(producer)}, depth=depth + 1)
            scaled = _scale_constants(graph, producer, constant_at, inverse)
            return None if upstream is None or scaled is None else upstream + scaled
    # Not into an activation's own constants (GELU's 0.5·x): a per-channel constant there stops ONNX Runtime fusing the
    # pattern into FastGelu, which costs more than the one Mul inserted instead (measured on MiniLM-L3).
    return None


def _scale_constants(graph: _Graph, node: onnx.NodeProto, indices: list[int], inverse: np.ndarray) -> list[Edit] | None:
    edits: list[Edit] = []
    for index in indices:
        if index >= len(node.input) or not node.input[index]:
            continue
        value = graph.constant(node.input[index])
        if value is None or value.dtype != np.float32 or (value.ndim and value.shape[-1] not in (1, len(inverse))):
            return None
        edits.append((node, index, node.input[index], (value * inverse).astype(np.float32)))
    return edits


def _fold_into_linear(graph: _Graph, node: onnx.NodeProto, inverse: np.ndarray) -> list[Edit] | None:
    """Divide a Gemm/MatMul's output columns (and a Gemm's bias) by s."""
    weight = graph.constant(node.input[1]) if len(node.input) > 1 else None
    if weight is None or weight.ndim != 2 or weight.dtype != np.float32:
        return None
    transposed = node.op_type == "Gemm" and bool(attributes(node).get("transB", 0))
    if node.op_type == "Gemm" and attributes(node).get("transA", 0):
        return None
    scaled = weight * inverse[:, None] if transposed else weight * inverse[None, :]
    edits: list[Edit] = [(node, 1, node.input[1], scaled.astype(np.float32))]
    if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
        bias = _scale_constants(graph, node, [2], inverse)
        if bias is None:
            return None
        edits += bias
    return edits


def _insert_mul(graph: _Graph, tensor: str, consumers: list[Consumer], inverse: np.ndarray) -> str:
    scale_name = graph.add_constant(f"{tensor}.inverse_scale", inverse)
    output = f"{tensor}.smoothed"
    name = f"{tensor}.smooth_mul"
    mul = helper.make_node("Mul", [tensor, scale_name], [output], name=name)
    nodes = list(graph.model.graph.node)
    first = min(nodes.index(consumer.node) for consumer in consumers)
    for consumer in consumers:
        consumer.node.input[0] = output
    graph.model.graph.node.insert(first, mul)
    return name


def _drop_unused_initializers(model: onnx.ModelProto) -> None:
    used = {name for node in model.graph.node for name in node.input} | {value.name for value in model.graph.output}
    keep = [tensor for tensor in model.graph.initializer if tensor.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
