"""Per-node quantization sensitivity: how much each compute node's own output suffers from INT8 (and INT4 weights).

Each candidate node (Conv, ConvTranspose, MatMul, Gemm, and the LSTMs ONNX Runtime's dynamic INT8 quantizes: their
input X and both weights W and R) is cut out into a one-node model twice:
as it is, and with its float activation inputs passed through QuantizeLinear/DequantizeLinear
(uint8, the calibrated range) and its weight fake-quantized per output channel to symmetric int8.
Both run on the node's real FP32 inputs, captured from the calibration set batch by batch within the
build memory budget (streaming.ActivationStream: in groups of tensors, a node's inputs together, when one
sample's tensors do not fit at once), so each node is judged on its own error, not on what upstream
quantization did to its inputs. The SQNR of the quantized node's output against the FP32 one ranks the
nodes, most sensitive (lowest) first.

For MatMuls with a 2-D constant weight the same is done for INT4 round-to-nearest weight-only
quantization (`int4_sqnr_db`), which is what the INT4/INT8 mixes are chosen from.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from kiln_contract.metrics import sqnr_from_energy
from workers.cost import MAC_OPS
from workers.datasets import dataset_samples
from workers.quantize.calibration_methods import calibrate, check_sample_count
from workers.quantize.streaming import ActivationStream

INT4_BLOCK_SIZE = 32
# Recurrent nodes ranked beside the MAC ops: ONNX Runtime's dynamic INT8 quantizes an LSTM's input and weights
# (DynamicQuantizeLSTM), and the search may keep one in float (Resemblyzer's first LSTM reads raw mel power: per-tensor
# INT8 there alone costs 0.012 of cosine_p5).
RECURRENT_OPS = ("LSTM",)
# Where an LSTM's weights sit among its inputs (W, R: [directions, 4 x hidden, ...], one scale per gate row), and the
# input that is not a float activation (sequence_lens, int32).
_RECURRENT_WEIGHTS = (1, 2)
_RECURRENT_INT_INPUT = 4


def rank_nodes(
    *,
    model_path: str | Path,
    calibration_path: str | Path,
    max_samples: int = 64,
    method: str = "minmax",
    batch_size: int = 8,
    int4_block_size: int = INT4_BLOCK_SIZE,
) -> list[dict[str, Any]]:
    """Rank the model's compute nodes by INT8 quantization error of their own output, worst first.

    Each entry: `node`, `op_type`, `sqnr_db` (INT8 activations + weights, higher is better),
    `relative_error` (‖q − f‖ / ‖f‖), `rank` (0 = most sensitive) and, for MatMuls with a
    constant 2-D weight, `int4_sqnr_db` and `int4_relative_error` (INT4 weight-only, block `int4_block_size`).
    """
    model = onnx.load(str(model_path))
    samples = min(dataset_samples(calibration_path), max_samples)
    check_sample_count(samples, method)
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    candidates = [node for node in model.graph.node if node.op_type in MAC_OPS or _rankable_recurrent(node, initializers)]
    if not candidates:
        return []
    for index, node in enumerate(candidates):
        if not node.name:
            node.name = f"{node.op_type}_{index}"
    activation_inputs = {node.name: [name for name in node.input if name and name not in initializers]
                         for node in candidates}
    tapped = sorted({name for names in activation_inputs.values() for name in names})
    ranges = calibrate(model_path, calibration_path, method=method, max_samples=samples,
                       batch_size=batch_size, tensor_names=tapped).ranges
    opset = _default_opset(model)
    probes = [_NodeProbe(node, initializers, ranges, opset, int4_block_size) for node in candidates]

    _observe_streamed(model_path, calibration_path, probes, tapped, batch_size=batch_size, samples=samples)

    rows = [probe.result() for probe in probes]
    order = {node.name: index for index, node in enumerate(candidates)}
    rows.sort(key=lambda row: (row["sqnr_db"], order[row["node"]]))
    for rank, row in enumerate(rows):
        row["rank"] = rank
    return rows


def _observe_streamed(model_path: str | Path, calibration_path: str | Path, probes: list[_NodeProbe], tapped: list[str], *,
                      batch_size: int, samples: int) -> None:
    """Feed every probe its node's FP32 inputs over the calibration set within the build memory budget: all tapped
    tensors at once at the batch that fits, else one sample at a time in groups that fit, each node's inputs together."""
    pending = list(probes)
    with ActivationStream(model_path, tapped, batch_size=batch_size, what="the sensitivity analysis") as stream:
        stream.reduce(calibration_path, limit=samples)
        for group, batches in stream.groups(calibration_path, limit=samples, units=[probe.inputs for probe in probes]):
            present = set(group)
            ready = [probe for probe in pending if set(probe.inputs) <= present]
            pending = [probe for probe in pending if probe not in ready]
            for _rows, activations in batches:
                for probe in ready:
                    probe.observe(activations)


def _rankable_recurrent(node: onnx.NodeProto, initializers: dict[str, TensorProto]) -> bool:
    """An LSTM whose weights are constants and whose sequence lengths, if any, are too (the probe feeds float inputs)."""
    if node.op_type not in RECURRENT_OPS or len(node.input) < 3:
        return False
    lengths = node.input[_RECURRENT_INT_INPUT] if len(node.input) > _RECURRENT_INT_INPUT else ""
    return all(node.input[index] in initializers for index in _RECURRENT_WEIGHTS) and (not lengths or lengths in initializers)


def _quantized_weights(node: onnx.NodeProto, weights: dict[str, np.ndarray]) -> list[tuple[str, int]]:
    """(name, output-channel axis) of each float weight the node's INT8 form quantizes."""
    if node.op_type in RECURRENT_OPS:
        names = [node.input[index] for index in _RECURRENT_WEIGHTS]
        return [(name, 1) for name in names if weights[name].dtype.kind == "f"]
    name = node.input[1] if len(node.input) > 1 and node.input[1] in weights else None
    if name is None or weights[name].dtype.kind != "f":
        return []
    return [(name, _weight_axis(node) % weights[name].ndim)]


def rank_int4_weights(rows: list[dict[str, Any]]) -> list[str]:
    """Names of the MatMuls that have an INT4 score, most INT4-sensitive first."""
    scored = [row for row in rows if row.get("int4_sqnr_db") is not None]
    return [row["node"] for row in sorted(scored, key=lambda row: row["int4_sqnr_db"])]


# ---------------------------------------------------------------------------------------------
# Fake quantization


def fake_quantize_per_channel(weight: np.ndarray, axis: int, *, bits: int = 8) -> np.ndarray:
    """Round-trip a weight through symmetric signed `bits`-bit integers with one scale per channel on `axis`."""
    levels = 2 ** (bits - 1) - 1
    reduce_axes = tuple(i for i in range(weight.ndim) if i != axis)
    absmax = np.max(np.abs(weight), axis=reduce_axes, keepdims=True)
    scale = np.where(absmax > 0, absmax / levels, 1.0)
    return (np.clip(np.round(weight / scale), -levels - 1, levels) * scale).astype(weight.dtype)


def fake_quantize_blockwise(weight: np.ndarray, *, bits: int = 4, block_size: int = INT4_BLOCK_SIZE) -> np.ndarray:
    """Round-trip a [K, N] MatMul weight through symmetric `bits`-bit integers, one scale per block of K per column.

    The same scheme as onnxruntime's MatMulNBits with is_symmetric=True (scale = absmax / 2^(bits-1)).
    """
    rows, columns = weight.shape
    padded_rows = math.ceil(rows / block_size) * block_size
    padded = np.zeros((padded_rows, columns), dtype=np.float64)
    padded[:rows] = weight
    blocks = padded.reshape(padded_rows // block_size, block_size, columns)
    absmax = np.max(np.abs(blocks), axis=1, keepdims=True)
    half = 2 ** (bits - 1)
    scale = np.where(absmax > 0, absmax / half, 1.0)
    quantized = np.clip(np.round(blocks / scale), -half, half - 1) * scale
    return quantized.reshape(padded_rows, columns)[:rows].astype(weight.dtype)


def _weight_axis(node: onnx.NodeProto) -> int:
    if node.op_type == "Gemm":
        trans_b = next((attr.i for attr in node.attribute if attr.name == "transB"), 0)
        return 0 if trans_b else 1
    if node.op_type == "ConvTranspose":
        return 1
    if node.op_type == "MatMul":
        return -1
    return 0


def _uint8_qparams(low: float, high: float) -> tuple[float, int]:
    low, high = min(low, 0.0), max(high, 0.0)
    scale = (high - low) / 255.0 if high > low else 1.0
    zero_point = int(np.clip(round(-low / scale), 0, 255))
    return scale, zero_point


class _NodeProbe:
    """One node as an FP32 model and as quantized models, with running error sums."""

    def __init__(self, node: onnx.NodeProto, initializers: dict[str, TensorProto],
                 ranges: dict[str, tuple[float, float]], opset: int, int4_block_size: int):
        self.node = node
        self.inputs = [name for name in node.input if name and name not in initializers]
        weights = {name: numpy_helper.to_array(initializers[name]) for name in node.input if name in initializers}
        weight_name = node.input[1] if len(node.input) > 1 and node.input[1] in weights else None
        self.reference = self._session(self._model(node, weights, {}, opset))

        quantized_weights = dict(weights)
        for name, axis in _quantized_weights(node, weights):
            quantized_weights[name] = fake_quantize_per_channel(weights[name], axis)
        # An LSTM's initial states stay float in its INT8 form; its input X is quantized.
        activations = self.inputs[:1] if node.op_type in RECURRENT_OPS else self.inputs
        qdq = {name: _uint8_qparams(*ranges.get(name, (0.0, 0.0))) for name in activations}
        self.int8 = self._session(self._model(node, quantized_weights, qdq, opset))
        self.int8_sums = [0.0, 0.0]

        self.int4 = None
        if (node.op_type == "MatMul" and weight_name is not None and weights[weight_name].ndim == 2
                and weights[weight_name].dtype.kind == "f"):
            int4_weights = dict(weights)
            int4_weights[weight_name] = fake_quantize_blockwise(weights[weight_name], block_size=int4_block_size)
            self.int4 = self._session(self._model(node, int4_weights, {}, opset))
        self.int4_sums = [0.0, 0.0]

    @staticmethod
    def _model(node: onnx.NodeProto, weights: dict[str, np.ndarray], qdq: dict[str, tuple[float, int]],
               opset: int) -> onnx.ModelProto:
        nodes, initializers = [], [numpy_helper.from_array(value, name) for name, value in weights.items()]
        renamed = []
        for name in node.input:
            if name in qdq:
                scale, zero_point = qdq[name]
                scale_name, zero_name = f"{name}.kiln_scale", f"{name}.kiln_zero"
                initializers += [numpy_helper.from_array(np.array(scale, np.float32), scale_name),
                                 numpy_helper.from_array(np.array(zero_point, np.uint8), zero_name)]
                nodes.append(helper.make_node("QuantizeLinear", [name, scale_name, zero_name], [f"{name}.kiln_q"]))
                nodes.append(helper.make_node("DequantizeLinear", [f"{name}.kiln_q", scale_name, zero_name],
                                              [f"{name}.kiln_dq"]))
                renamed.append(f"{name}.kiln_dq")
            else:
                renamed.append(name)
        # The first output (an LSTM's Y, which its graph may leave unnamed when only Y_h is read) is what is compared.
        output = node.output[0] or f"{node.name}.kiln_output"
        probe = helper.make_node(node.op_type, renamed, [output], name=node.name, domain=node.domain)
        probe.attribute.extend(node.attribute)
        nodes.append(probe)
        graph_inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
                        for name in dict.fromkeys(n for n in node.input if n and n not in weights)]
        graph = helper.make_graph(nodes, f"probe-{node.name}", graph_inputs,
                                  [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
                                  initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8
        return model

    @staticmethod
    def _session(model: onnx.ModelProto):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        # Hundreds of probes, two or three sessions each: an arena kept per session would hold every node's tensors at
        # once, past the build budget on a ViT. Without it a probe's memory goes back after each run.
        options.enable_cpu_mem_arena = False
        options.enable_mem_pattern = False
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def observe(self, activations: dict[str, np.ndarray]) -> None:
        feeds = {name: activations[name] for name in dict.fromkeys(self.inputs)}
        (reference,) = self.reference.run(None, feeds)
        reference = reference.astype(np.float64)
        signal = float(np.sum(reference * reference))
        for session, sums in ((self.int8, self.int8_sums), (self.int4, self.int4_sums)):
            if session is None:
                continue
            (output,) = session.run(None, feeds)
            sums[0] += signal
            sums[1] += float(np.sum((reference - output) ** 2))

    def result(self) -> dict[str, Any]:
        sqnr, relative = _scores(*self.int8_sums)
        row = {"node": self.node.name, "op_type": self.node.op_type, "sqnr_db": sqnr, "relative_error": relative}
        if self.int4 is not None:
            row["int4_sqnr_db"], row["int4_relative_error"] = _scores(*self.int4_sums)
        return row


def _scores(signal: float, noise: float) -> tuple[float, float]:
    """(SQNR in dB, relative error) from Σref² and Σ(ref−out)² over the calibration batches."""
    if noise == 0.0:
        relative = 0.0
    else:
        relative = math.sqrt(noise / signal) if signal else math.inf
    return sqnr_from_energy(signal, noise), relative


def _default_opset(model: onnx.ModelProto) -> int:
    return next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 17)
