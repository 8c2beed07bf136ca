"""Range rules on data with known answers, streaming calibration on small graphs, and bad calibration input."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.fixtures.models import write_npz
from tests.workers.helpers import run_model
from workers.quantize import QuantizationError, build_variant
from workers.quantize.calibration_methods import (
    CalibrationError,
    Histogram,
    calibrate,
    entropy_range,
    expected_mse,
    minmax_range,
    mse_range,
    percentile_range,
)


def _outlier_heavy(seed: int = 0) -> np.ndarray:
    # Student-t with 2 degrees of freedom: most values near 0, a few hundred times larger.
    return np.random.default_rng(seed).standard_t(2, 200_000)


def test_minmax_is_the_observed_extremes():
    values = np.random.default_rng(0).uniform(-1.0, 3.0, 50_000)
    low, high = minmax_range(Histogram.from_values(values))
    assert (low, high) == (values.min(), values.max())


def test_ranges_always_contain_zero():
    histogram = Histogram.from_values(np.random.default_rng(0).uniform(2.0, 5.0, 10_000))
    assert minmax_range(histogram)[0] == 0.0
    assert percentile_range(histogram)[0] == 0.0
    assert mse_range(histogram)[0] <= 0.0


def test_percentile_clips_a_lone_outlier_that_minmax_keeps():
    values = np.concatenate([np.random.default_rng(0).standard_normal(100_000), [500.0]])
    histogram = Histogram.from_values(values)
    assert minmax_range(histogram)[1] == 500.0
    low, high = percentile_range(histogram, 99.99)
    assert 3.0 < high < 6.0 and -6.0 < low < -3.0


def test_percentile_and_mse_are_tighter_than_minmax_on_outlier_heavy_data():
    histogram = Histogram.from_values(_outlier_heavy())
    minmax = minmax_range(histogram)
    percentile = percentile_range(histogram, 99.99)
    low, high, rule = mse_range(histogram)
    assert percentile[1] - percentile[0] < 0.6 * (minmax[1] - minmax[0])
    assert high - low < 0.8 * (minmax[1] - minmax[0])
    # The MSE choice is, by construction, no worse than any named rule on its own criterion.
    assert expected_mse(histogram, low, high) <= expected_mse(histogram, *minmax)
    assert expected_mse(histogram, low, high) <= expected_mse(histogram, *percentile)
    assert expected_mse(histogram, low, high) < 0.8 * expected_mse(histogram, *minmax)
    assert rule != "minmax"


def test_mse_keeps_the_full_range_of_uniform_data():
    values = np.random.default_rng(0).uniform(-1.0, 3.0, 100_000)
    low, high, _ = mse_range(Histogram.from_values(values))
    assert low == pytest.approx(-1.0, abs=0.02) and high == pytest.approx(3.0, abs=0.02)


def test_entropy_clips_the_long_tail_of_non_negative_data():
    values = np.abs(_outlier_heavy())
    histogram = Histogram.from_values(values)
    low, high = entropy_range(histogram)
    assert low == 0.0
    assert high < 0.2 * values.max()
    # A threshold below the bulk of the data would be wrong too.
    assert high > np.quantile(values, 0.9)


def _relu_graph(path, *, scale: float = 1.0):
    nodes = [helper.make_node("Mul", ["x", "k"], ["scaled"], name="scale"),
             helper.make_node("Relu", ["scaled"], ["y"], name="relu")]
    graph = helper.make_graph(
        nodes, "relu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [numpy_helper.from_array(np.array(scale, np.float32), "k")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_calibrate_streams_batches_to_the_same_ranges(tmp_path):
    model = _relu_graph(tmp_path / "relu.onnx")
    data = np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32)
    calibration = write_npz(tmp_path / "c.npz", x=data)
    small = calibrate(model, calibration, method="minmax", batch_size=3)
    whole = calibrate(model, calibration, method="minmax", batch_size=64)
    assert small.ranges == whole.ranges
    assert small.ranges["x"] == pytest.approx((float(data.min()), float(data.max())))
    assert small.ranges["y"] == pytest.approx((0.0, float(data.max())))
    assert small.samples == 64
    for method in ("percentile", "entropy", "mse"):
        streamed = calibrate(model, calibration, method=method, batch_size=5)
        assert set(streamed.ranges) == {"x", "scaled", "y"}
        low, high = streamed.ranges["y"]
        assert low == 0.0 and 0.0 < high <= float(data.max()) + 1e-6


def _detection_head(path):
    """A detector's last layer in miniature: a projection whose few large values are the objects, reshaped out."""
    weights = np.random.default_rng(3).standard_normal((16, 8)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"], name="head"),
             helper.make_node("Reshape", ["logits", "shape"], ["grid"], name="to_grid")]
    graph = helper.make_graph(
        nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("grid", TensorProto.FLOAT, ["n", 2, 4])],
        [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(np.array([-1, 2, 4], np.int64), "shape")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _mostly_background(rows: int = 1024) -> np.ndarray:
    # Background everywhere, an object (a row 40x larger) in one row of 256: the tail a detector is read for.
    data = np.random.default_rng(0).standard_normal((rows, 16)).astype(np.float32) * 0.05
    data[::256] *= 40.0
    return data


def test_tail_clipping_rules_keep_the_outputs_whole_and_clip_inside(tmp_path):
    model = _detection_head(tmp_path / "head.onnx")
    data = _mostly_background()
    calibration = write_npz(tmp_path / "c.npz", x=data)
    observed = data @ onnx.numpy_helper.to_array(onnx.load(str(model)).graph.initializer[0])
    # What the rule alone would do to the head: cut the objects off.
    assert entropy_range(Histogram.from_values(observed))[1] < 0.8 * float(observed.max())
    for method in ("entropy", "percentile"):
        result = calibrate(model, calibration, method=method)
        # The output and the tensor that becomes it through Reshape keep every object; the input keeps its rule.
        assert result.rules["grid"] == result.rules["logits"] == "output-minmax"
        assert result.ranges["logits"] == pytest.approx((float(observed.min()), float(observed.max())), rel=1e-5)
        assert result.rules["x"].startswith(method)
        assert result.summary()["rules"]["output"] == 2
    # MSE still weighs clipping against rounding on every tensor.
    assert "output-minmax" not in calibrate(model, calibration, method="mse").rules.values()


def test_calibrate_names_the_sample_holding_nan(tmp_path):
    model = _relu_graph(tmp_path / "relu.onnx")
    data = np.ones((32, 4), np.float32)
    data[21, 2] = np.nan
    calibration = write_npz(tmp_path / "c.npz", x=data)
    with pytest.raises(CalibrationError, match=r"'x' contains NaN or Inf \(first at sample 21\)"):
        calibrate(model, calibration, method="minmax", batch_size=8)


def test_too_few_samples_for_the_method_is_refused_with_the_number_needed(tmp_path, digits_path):
    calibration = write_npz(tmp_path / "c.npz", input=np.zeros((10, 1, 8, 8), np.float32))
    with pytest.raises(CalibrationError, match="10 samples; the entropy calibration method needs at least 16"):
        calibrate(digits_path, calibration, method="entropy")
    with pytest.raises(QuantizationError, match="the mse calibration method needs at least 16"):
        build_variant(model_path=digits_path, precision="int8", out_path=tmp_path / "x.onnx",
                      calibration_path=calibration, options={"calibration_method": "mse"})
    assert not (tmp_path / "x.onnx").exists()


def test_int8_with_kiln_mse_calibration_keeps_digits_accuracy(digits, digits_path, digits_calibration, tmp_path):
    out = tmp_path / "mse.onnx"
    result = build_variant(model_path=digits_path, precision="int8", out_path=out, calibration_path=digits_calibration,
                           options={"calibration_method": "mse", "reduce_range": True})
    recipe = result["recipe"]
    assert recipe["calibration_method"] == "MSE" and recipe["calibrator"].startswith("kiln")
    assert recipe["reduce_range"] is True and recipe["samples"] == len(digits.x_calib)
    assert sum(recipe["range_rules"].values()) > 0
    (logits,) = run_model(out, {"input": digits.x_val})
    assert float((logits.argmax(1) == digits.y_val).mean()) >= digits.fp32_accuracy - 0.02


def test_fp16_refuses_a_model_whose_activations_overflow(tmp_path):
    model = _relu_graph(tmp_path / "big.onnx", scale=1e5)
    calibration = write_npz(tmp_path / "c.npz", x=np.full((8, 4), 2.0, np.float32))
    with pytest.raises(QuantizationError, match=r"fp16 would overflow: .*'scaled' \(2e\+05\)"):
        build_variant(model_path=model, precision="fp16", out_path=tmp_path / "fp16.onnx", calibration_path=calibration)
    # Without calibration data nothing can be measured, and the conversion proceeds as before.
    build_variant(model_path=model, precision="fp16", out_path=tmp_path / "fp16.onnx")
