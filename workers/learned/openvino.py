"""Learned INT8 for OpenVINO: the learned rounding is handed to NNCF's own OpenVINO pipeline as float weights on its grid.

OpenVINO's INT8 variant is NNCF's IR (`workers.quantize.nncf_openvino`), not a QDQ file, so the learned
integers cannot be written into it the way they are written into ONNX Runtime's QDQ graph. NNCF's
OpenVINO weight scheme is per output channel, symmetric, narrow range: scale = max|w| / 127 and
integers in [-127, 127], rounded to nearest (read back from a built IR: its int8 constants and
their Multiply scales). So learning runs on a calibrated QDQ graph with exactly that weight grid
(`GRID_CALIBRATION`), and its integers are written back as FLOAT weights that lie on the grid
(`on_grid_weights`): NNCF then finds the same max|w| per channel, hence the same scale, and its
rounding to nearest of an on-grid value is the value itself. The IR carries the learned rounding;
`ir_weight_agreement` reads the IR back and says how many of its weights are the learned ones.

Only weights NNCF itself quantizes on that grid are written (`on_nncf_grid`, read from NNCF's own IR of
the FP32 model): a layer NNCF's preset keeps in float, or puts on another grid (its overflow fix's 7-bit
first convolution), keeps its FP32 weights. Learning sees OpenVINO's activation error: each layer's
input is quantized at the range NNCF's IR gives it (`nncf_input_ranges`, `align_input_ranges`). And
the learned IR is kept only when its outputs are closer to FP32's than NNCF's own IR
(`ir_output_error`).

One NNCF step would move weights off the grid after learning and is turned off for a learned build:
SmoothQuant (it rescales MatMul weights per input channel; `smooth_quant_alpha: -1`). Its bias
correction only changes biases, which stay float in the IR, and is kept.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from workers.quantize.nncf_openvino import RUNTIME as OPENVINO

from .layers import LEARNABLE_OPS, Layer

# ORT's calibration whose weight grid is NNCF's OpenVINO one: per-channel symmetric int8 in [-127, 127], scale max|w| / 127
# (no reduced range); only the weight layers' inputs quantized, their outputs float, as NNCF quantizes them.
GRID_CALIBRATION = {"calibration_method": "minmax", "per_channel": True, "activation_type": "uint8", "weight_type": "int8",
                    "reduce_range": False, "op_types_to_quantize": list(LEARNABLE_OPS), "float_outputs": list(LEARNABLE_OPS)}
# What NNCF is told for a learned build: no SmoothQuant, which would rescale the learned weights off their grid.
NNCF_OPTIONS = {"smooth_quant_alpha": -1}
NNCF_QMAX = 127
LAYER_TYPES = ("Convolution", "GroupConvolution", "MatMul")
# NNCF's IR of the FP32 model may round a few weights differently from the learning's grid (float rounding at a half);
# beyond this share the layer is on another grid.
GRID_MISMATCH_SHARE = 0.001
# Two weights are the same grid value when they differ by float rounding only: far below one step (>= 1/127 relative).
EQUAL_RELATIVE = 1e-4


def on_grid_weights(qdq: onnx.ModelProto, layers: list[Layer]) -> tuple[dict[str, np.ndarray], int]:
    """({FP32 weight name: the learned integers x their scale, float32}, channels pinned) of the learned layers of a QDQ graph.

    NNCF derives each channel's scale from its largest weight, so a channel whose learned integers all stay below 127 in
    magnitude would get a smaller scale and be rounded again; its largest weight is pinned to +-127 (one step at most:
    its value was 127 before rounding). The count of such channels is returned."""
    initializers = {tensor.name: tensor for tensor in qdq.graph.initializer}
    weights, pinned = {}, 0
    for layer in layers:
        integers = numpy_helper.to_array(initializers[layer.quantized_weight_name]).astype(np.int32)
        scale = numpy_helper.to_array(initializers[layer.weight_scale_name]).astype(np.float32)
        axis = None if scale.size == 1 else layer.weight.axis % integers.ndim
        integers, count = _pin_channel_maxima(integers, axis)
        pinned += count
        shape = [1] * integers.ndim
        if axis is not None:
            shape[axis] = -1
        weights[layer.weight_name] = (integers.astype(np.float32) * scale.reshape(shape)).astype(np.float32)
    return weights, pinned


def _pin_channel_maxima(integers: np.ndarray, axis: int | None) -> tuple[np.ndarray, int]:
    """The integers with each channel's largest magnitude set to +-NNCF_QMAX where it fell below; and how many were."""
    moved = np.moveaxis(integers, axis, 0).reshape(integers.shape[axis], -1).copy() if axis is not None else integers.reshape(1, -1).copy()
    pinned = 0
    for row in moved:
        largest = int(np.argmax(np.abs(row)))
        if row[largest] != 0 and abs(int(row[largest])) < NNCF_QMAX:
            row[largest] = NNCF_QMAX * np.sign(row[largest])
            pinned += 1
    if axis is None:
        return moved.reshape(integers.shape), pinned
    restored = moved.reshape((integers.shape[axis], *np.delete(integers.shape, axis)))
    return np.moveaxis(restored, 0, axis), pinned


def write_float_weights(model_path: Path, weights: dict[str, np.ndarray], out_path: Path) -> None:
    """The FP32 model at `model_path` with `weights` written over its initializers of the same names, saved to `out_path`."""
    model = onnx.load(str(model_path))
    for index, tensor in enumerate(model.graph.initializer):
        if tensor.name in weights:
            value = weights[tensor.name].reshape(tuple(tensor.dims)).astype(numpy_helper.to_array(tensor).dtype)
            model.graph.initializer[index].CopyFrom(numpy_helper.from_array(value, tensor.name))
    onnx.save(model, str(out_path))


def ir_int8_weights(ir_path: Path) -> list[np.ndarray]:
    """The dequantized int8 weights of a packed IR: each int8 Constant -> Convert -> (Subtract) -> Multiply(scale), as floats."""
    return [values for values, _ in _ir_weights(ir_path)]


def _ir_weights(ir_path: Path) -> list[tuple[np.ndarray, tuple[float, float, int] | None]]:
    """(dequantized values, its layer's input range `_input_fake_quantize`) of each int8 weight of a packed IR, read while
    the model is alive (an OpenVINO node keeps its inputs alive, not its consumers)."""
    import openvino as ov

    from devices.artifacts import read_openvino_ir

    xml, weights = read_openvino_ir(ir_path)
    model = ov.Core().read_model(xml.decode() if isinstance(xml, bytes) else xml, ov.Tensor(np.frombuffer(weights, np.uint8)))
    found = []
    for op in model.get_ordered_ops():
        if op.get_type_name() != "Multiply":
            continue
        values = _dequantized(op)
        if values is not None:
            found.append((values, _input_fake_quantize(op)))
    return found


def _dequantized(multiply) -> np.ndarray | None:
    """The float values of a weight decompression Multiply, or None when it is not one."""
    source, scale = (value.get_node() for value in multiply.input_values())
    if scale.get_type_name() != "Constant":
        return None
    zero = 0.0
    if source.get_type_name() == "Subtract":
        source, point = (value.get_node() for value in source.input_values())
        if point.get_type_name() == "Convert":
            point = point.input_value(0).get_node()
        if point.get_type_name() != "Constant":
            return None
        zero = point.get_data().astype(np.float32)
    if source.get_type_name() != "Convert" or source.input_value(0).get_node().get_type_name() != "Constant":
        return None
    constant = source.input_value(0).get_node()
    if constant.get_output_element_type(0).get_type_name() not in ("i8", "u8"):
        return None
    return ((constant.get_data().astype(np.float32) - zero) * scale.get_data().astype(np.float32)).astype(np.float32)


def ir_weight_shares(ir_path: Path, expected: dict[str, np.ndarray]) -> dict[str, float]:
    """Per expected weight, the share of its elements the IR holds exactly (up to float rounding; one grid step apart,
    1/|integer| relative at least, is a different rounding): compared with the IR int8 weight with as many elements
    (OpenVINO may reshape a grouped convolution's) nearest to it. A weight the IR keeps in float is absent."""
    candidates = ir_int8_weights(ir_path)
    shares = {}
    for name, value in expected.items():
        same = [weight.reshape(value.shape) for weight in candidates if weight.size == value.size]
        if not same:
            continue
        weight = min(same, key=lambda candidate: float(np.max(np.abs(candidate - value))))
        shares[name] = float(np.mean(np.abs(weight - value) <= EQUAL_RELATIVE * np.maximum(np.abs(weight), np.abs(value))))
    return shares


def on_nncf_grid(plain_ir: Path, nearest: dict[str, np.ndarray]) -> set[str]:
    """The weights NNCF quantizes on the learning's grid: those whose int8 values in NNCF's own IR of the FP32 model are
    the FP32 weights rounded to nearest on that grid (`nearest`). The others (kept in float by NNCF's preset, or on
    another grid) are handed to NNCF as they are, so that learning never quantizes a weight NNCF would not."""
    return {name for name, share in ir_weight_shares(plain_ir, nearest).items() if share >= 1.0 - GRID_MISMATCH_SHARE}


def nncf_input_ranges(plain_ir: Path, nearest: dict[str, np.ndarray]) -> dict[str, tuple[float, float, int]]:
    """Per weight of `nearest` found in NNCF's IR (its int8 values, the FP32 weight rounded to nearest), the range NNCF
    quantizes that layer's input to: (low, high, levels) of the per-tensor FakeQuantize before the layer."""
    found = [(values, fake_quantize) for values, fake_quantize in _ir_weights(plain_ir) if fake_quantize is not None]
    ranges = {}
    for name, value in nearest.items():
        same = [(values.reshape(value.shape), fake_quantize) for values, fake_quantize in found if values.size == value.size]
        if same:
            ranges[name] = min(same, key=lambda pair: float(np.max(np.abs(pair[0] - value))))[1]
    return ranges


def _input_fake_quantize(multiply) -> tuple[float, float, int] | None:
    """(low, high, levels) of the per-tensor FakeQuantize on the data input of the layer a weight Multiply feeds."""
    consumers = [target.get_node() for target in multiply.output(0).get_target_inputs()]
    consumers = [target.get_node() for node in consumers for target in node.output(0).get_target_inputs()
                 if node.get_type_name() in ("Reshape", "Convert")] + consumers
    for node in consumers:
        if node.get_type_name() not in LAYER_TYPES:
            continue
        source = node.input_value(0).get_node()
        if source.get_type_name() != "FakeQuantize":
            return None
        low, high = (source.input_value(index).get_node() for index in (1, 2))
        if low.get_type_name() != "Constant" or high.get_type_name() != "Constant":
            return None
        low, high = low.get_data(), high.get_data()
        if low.size != 1 or high.size != 1:
            return None
        return float(low.reshape(-1)[0]), float(high.reshape(-1)[0]), int(source.get_levels())
    return None


def align_input_ranges(qdq: onnx.ModelProto, layers: list[Layer], ranges: dict[str, tuple[float, float, int]]) -> int:
    """Set each layer's input quantization in the QDQ graph to the range NNCF quantizes it to (scale (high - low) / (levels
    - 1), the zero point placing `low`), so that learning makes up for the error OpenVINO will have; returns how many."""
    producers = {output: node for node in qdq.graph.node for output in node.output}
    initializers = {tensor.name: index for index, tensor in enumerate(qdq.graph.initializer)}
    aligned = 0
    for layer in layers:
        dequantize = producers.get(layer.quantized_input_name)
        if layer.weight_name not in ranges or dequantize is None or len(dequantize.input) < 3:
            continue
        scale_name, zero_name = dequantize.input[1], dequantize.input[2]
        if scale_name not in initializers or zero_name not in initializers:
            continue
        low, high, levels = ranges[layer.weight_name]
        scale = max(high - low, 1e-12) / max(levels - 1, 1)
        zero_tensor = qdq.graph.initializer[initializers[zero_name]]
        dtype = numpy_helper.to_array(zero_tensor).dtype
        info = np.iinfo(dtype)
        zero = np.clip(np.round(info.min - low / scale), info.min, info.max).astype(dtype)
        qdq.graph.initializer[initializers[scale_name]].CopyFrom(numpy_helper.from_array(np.array(scale, np.float32), scale_name))
        zero_tensor.CopyFrom(numpy_helper.from_array(np.array(zero, dtype), zero_name))
        aligned += 1
    return aligned


def ir_weight_agreement(ir_path: Path, learned: dict[str, np.ndarray]) -> dict[str, Any]:
    """How many of the learned weights the IR holds exactly, as a summary for the recipe (`ir_weight_shares`)."""
    values = list(ir_weight_shares(ir_path, learned).values())
    return {"layers_found": len(values), "layers_learned": len(learned),
            "equal_share_min": round(min(values), 6) if values else None,
            "equal_share_mean": round(float(np.mean(values)), 6) if values else None}


def ir_output_error(ir_path: Path, batches: list[dict[str, np.ndarray]], reference: dict[str, np.ndarray]) -> float:
    """The IR's outputs on `batches` (run by OpenVINO, one thread), their squared error relative to `reference`'s energy
    (the FP32 outputs, by name), summed over outputs."""
    import tempfile

    from devices.backends.registry import get_backend

    with tempfile.TemporaryDirectory(prefix="kiln-ir-error-") as scratch:
        compiled = get_backend(OPENVINO).compile(ir_path, Path(scratch), threads=1)
        try:
            parts: dict[str, list[np.ndarray]] = {name: [] for name in reference}
            for batch in batches:
                outputs = compiled.run(batch)
                for name in reference:
                    parts[name].append(np.asarray(outputs[name], np.float32))
        finally:
            compiled.close()
    return float(sum(np.mean((np.concatenate(parts[name]) - target) ** 2) / max(float(np.mean(target ** 2)), 1e-20)
                     for name, target in reference.items()))
