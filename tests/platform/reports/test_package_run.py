"""The package's run.py loads the model with the compile options Kiln measured (static shapes, threads, hints)."""
from __future__ import annotations

import hashlib
import importlib.util

import numpy as np
import onnx
import pytest

from kiln_client import package_run
from tests.devices.conftest import build_tiny_cnn

HAS_OPENVINO = importlib.util.find_spec("openvino") is not None


def _package(tmp_path, compile_options):
    model = tmp_path / "model.onnx"
    onnx.save(build_tiny_cnn(), str(model))
    entry = {"path": "model.onnx", "original_path": "model.onnx", "role": "model",
             "sha256": hashlib.sha256(model.read_bytes()).hexdigest(), "encrypted": False}
    return {"files": [entry], "backend": "onnxruntime", "compile": compile_options}


@pytest.mark.parametrize("backend", [
    "onnxruntime",
    pytest.param("openvino", marks=pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed")),
])
def test_run_py_specialises_to_the_static_shapes_kiln_measured(tmp_path, backend):
    manifest = _package(tmp_path, {"static_shapes": {"input": [1, 1, 8, 8]}, "threads": 1})
    names, run = package_run.load(tmp_path, manifest, None, backend)
    assert names == ["input"]
    one = np.zeros((1, 1, 8, 8), np.float32)
    run({"input": one})
    # A static-shape model takes batch 1 only: proof that the options were applied, not ignored.
    with pytest.raises(Exception):  # noqa: B017 (each runtime raises its own type)
        run({"input": np.zeros((2, 1, 8, 8), np.float32)})


def test_run_py_without_compile_options_keeps_the_dynamic_batch(tmp_path):
    names, run = package_run.load(tmp_path, _package(tmp_path, {}), None, "onnxruntime")
    outputs = run({"input": np.zeros((3, 1, 8, 8), np.float32)})
    assert outputs[0].shape == (3, 10)


def test_run_py_passes_the_openvino_hints():
    assert package_run._ov_config({}) == {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
    # As on the device: a quantized model runs in OpenVINO's default precision, which takes its INT8 kernels.
    assert package_run._ov_config({}, "int8") == {"PERFORMANCE_HINT": "LATENCY"}
    assert package_run._ov_config({"inference_precision": "bf16"}, "int8")["INFERENCE_PRECISION_HINT"] == "bf16"
    assert package_run._ov_config({"performance_hint": "THROUGHPUT", "inference_precision": "bf16", "threads": 2}) == {
        "PERFORMANCE_HINT": "THROUGHPUT", "INFERENCE_PRECISION_HINT": "bf16", "INFERENCE_NUM_THREADS": 2}


@pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed")
def test_run_py_runs_an_openvino_ir_package_on_openvino_only(tmp_path):
    import openvino as ov

    from devices.artifacts import pack_openvino_ir

    source = tmp_path / "source.onnx"
    onnx.save(build_tiny_cnn(), str(source))
    ov.save_model(ov.Core().read_model(str(source)), str(tmp_path / "ir.xml"), compress_to_fp16=False)
    packed = pack_openvino_ir(tmp_path / "ir.xml", tmp_path / "ir.bin", tmp_path / "model.openvino.tar")
    entry = {"path": packed.name, "original_path": packed.name, "role": "model",
             "sha256": hashlib.sha256(packed.read_bytes()).hexdigest(), "encrypted": False}
    manifest = {"files": [entry], "backend": "openvino", "compile": {}, "variant": {"precision": "int8"}}
    names, run = package_run.load(tmp_path, manifest, None, "openvino")
    assert names == ["input"]
    outputs = run({"input": np.zeros((2, 1, 8, 8), np.float32)})
    assert next(iter(outputs.values())).shape == (2, 10)
    with pytest.raises(SystemExit, match="OpenVINO IR"):
        package_run.load(tmp_path, manifest, None, "onnxruntime")
