"""Learned INT8 built for OpenVINO: learned on NNCF's weight grid, quantized by NNCF's OpenVINO pipeline, and the IR carries
the learned rounding (its int8 weights are the learned integers, not the FP32 weights rounded to nearest)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from devices.backends.registry import get_backend
from kiln_contract import metrics
from tests.fixtures.models import write_npz
from tests.fixtures.rounding import build_rounding_sensitive_mlp, rounding_inputs
from workers.learned.layers import find_layers
from workers.learned.openvino import (
    GRID_CALIBRATION,
    NNCF_QMAX,
    _pin_channel_maxima,
    align_input_ranges,
    ir_int8_weights,
    nncf_input_ranges,
    on_grid_weights,
)
from workers.quantize import build_variant

pytestmark = pytest.mark.timeout(300)
OPENVINO = {"runtime": "openvino"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("learned-openvino")
    model = root / "model.onnx"
    onnx.save(build_rounding_sensitive_mlp(), model)
    calibration = write_npz(root / "calibration.npz", input=rounding_inputs(samples=128, seed=1))
    plain, learned = root / "plain.openvino.tar", root / "learned.openvino.tar"
    build_variant(model_path=model, precision="int8", out_path=plain, calibration_path=calibration, options=OPENVINO)
    result = build_variant(model_path=model, precision="int8", out_path=learned, calibration_path=calibration,
                           options={**OPENVINO, "learn": "adaround", "learn_seconds": 6})
    return {"root": root, "model": model, "plain": plain, "learned": learned, "result": result,
            "validation": rounding_inputs(samples=64, seed=2)}


def run(backend: str, path, inputs) -> np.ndarray:
    compiled = get_backend(backend).compile(path, path.parent / f"{path.name}-compiled", threads=1)
    try:
        return compiled.run({"input": inputs})[compiled.output_names[0]]
    finally:
        compiled.close()


def ir_integers(path, shape) -> tuple[np.ndarray, np.ndarray]:
    """(integers, per-column scale) of the IR's int8 weight of `shape` (a MatMul's [in, out]: NNCF's channels are columns)."""
    weight = next(value for value in ir_int8_weights(path) if value.shape == shape)
    scale = np.abs(weight).max(axis=0, keepdims=True) / NNCF_QMAX
    return weight / scale, scale


def test_the_openvino_ir_carries_the_learned_rounding_not_rounding_to_nearest(built):
    assert built["result"]["format"] == "openvino-ir" and built["result"]["backends"] == ["openvino"]
    fp32 = {tensor.name: numpy_helper.to_array(tensor) for tensor in onnx.load(str(built["model"])).graph.initializer}["w_first"]
    learned, scale = ir_integers(built["learned"], fp32.shape)
    plain, plain_scale = ir_integers(built["plain"], fp32.shape)
    # Both on NNCF's grid (max|w| / 127 per output channel) with the FP32 model's scales ...
    np.testing.assert_allclose(learned, np.round(learned), atol=1e-3)
    np.testing.assert_allclose(scale, plain_scale, rtol=1e-6)
    nearest = np.round(fp32 / plain_scale)
    # ... plain NNCF rounds to nearest; the learned IR rounds many weights the other way, each by one step (floor or ceil).
    assert np.array_equal(np.round(plain), nearest)
    flipped = np.round(learned) != nearest
    assert flipped.mean() > 0.05, flipped.mean()
    assert np.all(np.abs(np.round(learned) - fp32 / plain_scale) < 1.0 + 1e-4)
    # The recipe read the IR back: every learned layer's weights are the learned grid values, exactly.
    check = built["result"]["recipe"]["learned"]["ir_weights_learned"]
    assert check["layers_found"] == check["layers_learned"] == 2 and check["equal_share_min"] == 1.0
    # Both layers were learned with their inputs quantized at NNCF's own ranges, read from its IR.
    assert built["result"]["recipe"]["learned"]["input_ranges_from_nncf"] == 2


def test_the_learned_openvino_ir_is_closer_to_fp32_than_nncfs_own(built):
    inputs = built["validation"]
    reference = run("onnxruntime", built["model"], inputs)
    plain, learned = run("openvino", built["plain"], inputs), run("openvino", built["learned"], inputs)
    assert not np.allclose(plain, learned)
    assert metrics.cosine_similarity(learned, reference) > metrics.cosine_similarity(plain, reference) + 0.01
    recipe = built["result"]["recipe"]
    assert recipe["quant_format"] == "OpenVINO IR (FakeQuantize)" and recipe["learned"]["runtime"] == "openvino"
    assert recipe["learned"]["kept"] == "learned"


def test_a_layers_input_is_quantized_at_the_range_nncf_gave_it(built, tmp_path):
    calibrated = tmp_path / "calibrated.onnx"
    build_variant(model_path=built["model"], precision="int8", out_path=calibrated, calibration_path=built["root"] / "calibration.npz",
                  options=GRID_CALIBRATION)
    qdq, fp32 = onnx.load(str(calibrated)), onnx.load(str(built["model"]))
    layers = find_layers(qdq, fp32)
    ranges = nncf_input_ranges(built["plain"], on_grid_weights(qdq, layers)[0])
    assert sorted(ranges) == ["w_first", "w_second"] and all(levels == 256 for _, _, levels in ranges.values())
    assert align_input_ranges(qdq, layers, ranges) == 2
    for layer in find_layers(qdq, fp32):
        low, high, levels = ranges[layer.weight_name]
        scale, zero = float(layer.activation.scale.reshape(-1)[0]), int(layer.activation.zero_point.reshape(-1)[0])
        # The QDQ graph's uint8 grid spans NNCF's [low, high] (the zero point rounds low onto the grid).
        assert scale == pytest.approx((high - low) / (levels - 1), rel=1e-6)
        assert (0 - zero) * scale == pytest.approx(low, abs=scale / 2) and (255 - zero) * scale == pytest.approx(high, abs=scale / 2)


def test_a_channel_whose_learned_integers_stay_below_127_is_pinned_to_keep_nncfs_scale():
    integers = np.array([[126, -3, 5], [-127, 2, 0], [0, 0, 0]])
    pinned, count = _pin_channel_maxima(integers, axis=0)
    # Only the first channel moves, and only its largest weight, by one step; an all-zero channel has no scale to keep.
    assert count == 1 and pinned.tolist() == [[127, -3, 5], [-127, 2, 0], [0, 0, 0]]
    columns, count = _pin_channel_maxima(integers.T.copy(), axis=1)
    assert count == 1 and columns.tolist() == pinned.T.tolist()


def small_opset11_cnn() -> onnx.ModelProto:
    """input [batch, 4, 12, 12] -> Conv 3x3 with bias -> Relu -> Conv 1x1, at opset 11 (as PP-OCRv6's recogniser is)."""
    rng = np.random.default_rng(0)
    initializers = [numpy_helper.from_array(rng.standard_normal((8, 4, 3, 3)).astype(np.float32) * 0.3, "w1"),
                    numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "b1"),
                    numpy_helper.from_array(rng.standard_normal((6, 8, 1, 1)).astype(np.float32) * 0.3, "w2")]
    nodes = [onnx.helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             onnx.helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
             onnx.helper.make_node("Conv", ["r1", "w2"], ["output"], name="conv2")]
    graph = onnx.helper.make_graph(nodes, "cnn", [onnx.helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, ["batch", 4, 12, 12])],
                                   [onnx.helper.make_tensor_value_info("output", onnx.TensorProto.FLOAT, ["batch", 6, 12, 12])], initializers)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 11)])
    model.ir_version = 6
    return model


def test_an_opset_11_convolution_model_is_learned_for_openvino_where_nncf_uses_the_learning_grid(tmp_path):
    # ONNX Runtime's per-channel QDQ graph of an opset-11 model is invalid (DequantizeLinear has no axis there): the
    # learning converts it first. NNCF's overflow fix puts the first convolution on a 7-bit grid, not the learning's:
    # that layer is handed to NNCF with its FP32 weights (so it is NNCF's own), the second carries the learned values.
    model = tmp_path / "cnn.onnx"
    onnx.save(small_opset11_cnn(), model)
    calibration = write_npz(tmp_path / "calibration.npz", input=np.random.default_rng(1).standard_normal((32, 4, 12, 12)).astype(np.float32))
    learned, plain = tmp_path / "learned.openvino.tar", tmp_path / "plain.openvino.tar"
    built = build_variant(model_path=model, precision="int8", out_path=learned, calibration_path=calibration,
                          options={**OPENVINO, "learn": "adaround", "learn_seconds": 3})
    build_variant(model_path=model, precision="int8", out_path=plain, calibration_path=calibration, options=OPENVINO)
    recipe = built["recipe"]["learned"]
    assert recipe["layers_on_nncf_grid"] == 1
    assert recipe["ir_weights_learned"] == {"layers_found": 1, "layers_learned": 1, "equal_share_min": 1.0, "equal_share_mean": 1.0}
    first = [next(value for value in ir_int8_weights(path) if value.shape == (8, 4, 3, 3)) for path in (learned, plain)]
    np.testing.assert_array_equal(*first)
