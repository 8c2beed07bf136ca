"""LiteRT variants: the host converts ONNX to a .tflite that keeps the model's names and layouts, and the agent's
LiteRT backend runs it (FP32 equal to ONNX Runtime, INT8 calibrated and integer inside)."""
from __future__ import annotations

import importlib.util

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from devices.artifacts import ONNX, TFLITE, artifact_format
from devices.backends.registry import get_backend
from tests.devices.conftest import build_tiny_cnn
from tests.fixtures.models import write_npz
from workers.quantize import QuantizationError, build_variant, runnable_backends

pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(name) for name in ("tensorflow", "onnx2tf", "ai_edge_litert")),
    reason="the LiteRT converter is the `litert` extra (make install puts it in .venv)")


def gelu_map_model() -> onnx.ModelProto:
    """Two outputs, names a Python identifier cannot hold, a GELU written with Erf (no LiteRT kernel), and a
    channels-first map [1, 5, 6, 10] whose every axis differs: what the conversion must bring back exactly."""
    rng = np.random.default_rng(3)
    weights = [numpy_helper.from_array(rng.standard_normal((5, 3, 3, 3)).astype(np.float32) * 0.3, "w"),
               numpy_helper.from_array(np.array(2 ** -0.5, np.float32), "rsqrt2"),
               numpy_helper.from_array(np.array(1.0, np.float32), "one"),
               numpy_helper.from_array(np.array(0.5, np.float32), "half"),
               numpy_helper.from_array(np.array([1, -1], np.int64), "flat")]
    nodes = [
        helper.make_node("Conv", ["input.1", "w"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("Mul", ["conv", "rsqrt2"], ["scaled"]),
        helper.make_node("Erf", ["scaled"], ["erf"]),
        helper.make_node("Add", ["erf", "one"], ["erf1"]),
        helper.make_node("Mul", ["conv", "erf1"], ["gelu2"]),
        helper.make_node("Mul", ["gelu2", "half"], ["feature.map"]),
        helper.make_node("ReduceMean", ["feature.map"], ["pooled"], axes=[2, 3], keepdims=0),
        helper.make_node("Reshape", ["pooled", "flat"], ["387"]),
    ]
    graph = helper.make_graph(nodes, "gelu_map", [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, ["batch", 3, 6, 10])],
                              [helper.make_tensor_value_info("feature.map", TensorProto.FLOAT, ["batch", 5, 6, 10]),
                               helper.make_tensor_value_info("387", TensorProto.FLOAT, ["batch", 5])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("litert")
    model = root / "tiny.onnx"
    onnx.save(build_tiny_cnn(), str(model))
    rng = np.random.default_rng(0)
    calibration = write_npz(root / "calibration.npz", input=rng.standard_normal((16, 1, 8, 8)).astype(np.float32))
    return root, model, calibration


@pytest.fixture(scope="module")
def fp32_build(tiny):
    root, model, calibration = tiny
    out = root / "fp32.bin"
    return out, build_variant(model_path=model, precision="fp32", out_path=out, calibration_path=calibration, options={"runtime": "litert"})


def _run(path, feeds, tmp_path, **options):
    compiled = get_backend("litert").compile(path, tmp_path / "compiled", options=options)
    try:
        return compiled, compiled.run(feeds)
    finally:
        compiled.close()


def test_fp32_is_a_tflite_that_only_litert_runs_and_equals_onnx_runtime(tiny, fp32_build, tmp_path):
    _, model, _ = tiny
    out, built = fp32_build
    assert artifact_format(out) == TFLITE and artifact_format(model) == ONNX
    assert built["format"] == TFLITE and built["backends"] == ["litert"] and runnable_backends(out) == ["litert"]
    assert built["size_bytes"] == out.stat().st_size
    assert built["recipe"]["runtime"] == "litert" and built["recipe"]["input_shapes"] == {"input": [1, 1, 8, 8]}
    assert built["recipe"]["conversion_check"]["worst_relative_l2"] < 1e-5
    feeds = {"input": np.random.default_rng(5).standard_normal((1, 1, 8, 8)).astype(np.float32)}
    compiled, outputs = _run(out, feeds, tmp_path, threads=2)
    assert compiled.input_names == ["input"] and compiled.output_names == ["logits"] and compiled.threads == 2
    assert compiled.artifact_path.name == "model.tflite" and compiled.artifact_path.read_bytes() == out.read_bytes()
    expected = ort.InferenceSession(str(model)).run(None, feeds)[0]
    np.testing.assert_allclose(outputs["logits"], expected, rtol=1e-4, atol=1e-5)


def test_litert_refuses_onnx_and_shapes_it_was_not_built_for(tiny, fp32_build, tmp_path):
    _, model, _ = tiny
    out, _ = fp32_build
    with pytest.raises(ValueError, match="this file is ONNX"):
        get_backend("litert").compile(model, tmp_path / "a")
    with pytest.raises(ValueError, match="fixed shapes"):
        get_backend("litert").compile(out, tmp_path / "b", options={"static_shapes": {"input": [4, 1, 8, 8]}})


def test_int8_is_full_integer_calibrated_on_the_job_data(tiny, fp32_build, tmp_path):
    _, model, calibration = tiny
    out = tmp_path / "int8.bin"
    built = build_variant(model_path=model, precision="int8", out_path=out, calibration_path=calibration, options={"runtime": "litert"})
    recipe = built["recipe"]
    assert recipe["samples"] == 16 and recipe["method"].startswith("full integer") and recipe["io"].startswith("float32")
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(out))
    # Weights of the convolution and the matmul are int8 tensors; the model is fed and read in float32.
    assert any(detail["dtype"] == np.int8 and len(detail["shape"]) == 4 for detail in interpreter.get_tensor_details())
    assert interpreter.get_input_details()[0]["dtype"] == np.float32
    assert out.stat().st_size < 0.5 * fp32_build[0].stat().st_size
    feeds = {"input": np.random.default_rng(6).standard_normal((1, 1, 8, 8)).astype(np.float32)}
    _, outputs = _run(out, feeds, tmp_path)
    expected = ort.InferenceSession(str(model)).run(None, feeds)[0]
    cosine = float(np.dot(outputs["logits"].ravel(), expected.ravel()) / np.linalg.norm(outputs["logits"]) / np.linalg.norm(expected))
    assert 0.98 < cosine < 1.0 - 1e-7, cosine


def test_fp16_halves_the_weights_and_keeps_float32_io(tiny, fp32_build, tmp_path):
    _, model, calibration = tiny
    out = tmp_path / "fp16.bin"
    built = build_variant(model_path=model, precision="fp16", out_path=out, calibration_path=calibration, options={"runtime": "litert"})
    assert built["recipe"]["method"] == "float16 weights" and built["backends"] == ["litert"]
    # Most of this tiny flatbuffer is its 2,610 weights: stored in float16, they take half the bytes.
    assert 0.4 < out.stat().st_size / fp32_build[0].stat().st_size < 0.7
    feeds = {"input": np.random.default_rng(7).standard_normal((1, 1, 8, 8)).astype(np.float32)}
    compiled, outputs = _run(out, feeds, tmp_path)
    assert compiled.input_specs[0].dtype == np.float32
    np.testing.assert_allclose(outputs["logits"], ort.InferenceSession(str(model)).run(None, feeds)[0], rtol=1e-2, atol=1e-2)


def test_int8_without_enough_calibration_data_says_so(tiny, tmp_path):
    _, model, _ = tiny
    with pytest.raises(QuantizationError, match="LiteRT int8 needs a calibration dataset"):
        build_variant(model_path=model, precision="int8", out_path=tmp_path / "x", options={"runtime": "litert"})
    few = write_npz(tmp_path / "few.npz", input=np.zeros((3, 1, 8, 8), np.float32))
    with pytest.raises(QuantizationError, match="fewer than 8 samples"):
        build_variant(model_path=model, precision="int8", out_path=tmp_path / "x", calibration_path=few, options={"runtime": "litert"})
    with pytest.raises(ValueError, match="takes no learn"):
        build_variant(model_path=model, precision="int8", out_path=tmp_path / "x", options={"runtime": "litert", "learn": True})


def test_names_layouts_and_erf_come_through_the_conversion(tmp_path):
    model = tmp_path / "gelu.onnx"
    onnx.save(gelu_map_model(), str(model))
    data = np.random.default_rng(1).standard_normal((4, 3, 6, 10)).astype(np.float32)
    calibration = write_npz(tmp_path / "calibration.npz", **{"input.1": data})
    out = tmp_path / "gelu.tflite"
    built = build_variant(model_path=model, precision="fp32", out_path=out, calibration_path=calibration, options={"runtime": "litert"})
    # LiteRT has no Erf kernel: onnx2tf's built-in replacement was used, and the result still equals ONNX Runtime.
    assert built["recipe"]["pseudo_operators"] == ["Erf"]
    assert built["recipe"]["output_transposes"] == {"feature.map": [0, 3, 1, 2]}
    feeds = {"input.1": data[:1]}
    compiled, outputs = _run(out, feeds, tmp_path)
    assert compiled.input_names == ["input.1"] and sorted(compiled.output_names) == ["387", "feature.map"]
    expected = dict(zip(["feature.map", "387"], ort.InferenceSession(str(model)).run(None, feeds)))
    for name, value in expected.items():
        assert outputs[name].shape == value.shape
        np.testing.assert_allclose(outputs[name], value, rtol=1e-4, atol=1e-4)
