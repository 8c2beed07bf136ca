"""The OpenVINO backend: the artifacts it reads (ONNX, a packed IR) and the precision it compiles them in."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from devices.backends.openvino import _config
from tests.devices.conftest import reference_logits

HAS_OPENVINO = importlib.util.find_spec("openvino") is not None
needs_openvino = pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed (pip install kiln-agent[openvino])")


def test_an_fp32_model_runs_in_f32_unless_the_variant_asks_otherwise():
    assert _config(None)["INFERENCE_PRECISION_HINT"] == "f32"
    assert _config(None, options={"inference_precision": "bf16"})["INFERENCE_PRECISION_HINT"] == "bf16"


def test_a_quantized_model_gets_no_precision_hint_but_the_one_the_variant_asks_for():
    assert "INFERENCE_PRECISION_HINT" not in _config(2, quantized=True)
    assert _config(2, quantized=True) == {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 2}
    assert _config(None, quantized=True, options={"inference_precision": "f32"})["INFERENCE_PRECISION_HINT"] == "f32"


def _qdq_model(model_path, root, activation_type: str):
    from onnxruntime.quantization import QuantType, quantize_static

    from tests.fixtures.models import write_npz
    from workers.quantize.calibration import NpzCalibrationReader

    calibration = write_npz(root / "calibration.npz",
                            input=np.random.default_rng(5).standard_normal((16, 1, 8, 8)).astype(np.float32))
    out = root / f"tiny_qdq_{activation_type}.onnx"
    quantize_static(str(model_path), str(out), NpzCalibrationReader(calibration, input_names=["input"], batch_size=4),
                    activation_type=getattr(QuantType, activation_type))
    return out


@needs_openvino
def test_a_packed_ir_compiles_with_the_models_names_and_outputs(tiny_ir_path, tiny_model_path, tmp_path, sample_feeds):
    from devices.backends.openvino import OpenVinoBackend

    compiled = OpenVinoBackend().compile(tiny_ir_path, tmp_path / "ir", threads=1)
    try:
        assert compiled.input_names == ["input"] and compiled.output_names == ["logits"]
        np.testing.assert_allclose(compiled.run(sample_feeds)["logits"],
                                   reference_logits(tiny_model_path, sample_feeds["input"]), rtol=1e-4, atol=1e-4)
        profile = compiled.profile(sample_feeds, runs=2)
        assert profile["by_op_type"]
    finally:
        compiled.close()
    support = OpenVinoBackend().operator_support(tiny_ir_path)
    assert support["verdict"] == "runs" and not support["unsupported"]


@needs_openvino
def test_a_quantized_model_compiles_in_the_plugins_default_precision_and_fp32_in_f32(tiny_model_path, tmp_path):
    import openvino as ov

    from devices.backends.openvino import OpenVinoBackend, is_quantized, read_artifact

    core = ov.Core()
    quantized_path = _qdq_model(tiny_model_path, tmp_path, "QUInt8")
    assert is_quantized(read_artifact(core, quantized_path))
    assert not is_quantized(read_artifact(core, tiny_model_path))
    default = core.get_property("CPU", "INFERENCE_PRECISION_HINT")
    for path, expected in ((quantized_path, default), (tiny_model_path, ov.Type.f32)):
        compiled = OpenVinoBackend().compile(path, tmp_path / path.stem, threads=1)
        try:
            assert compiled.compiled.get_property("INFERENCE_PRECISION_HINT") == expected
            # What the float remainder runs in is reported, in the labels' words.
            assert compiled.float_precision == {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}[expected.get_type_name()]
        finally:
            compiled.close()


@needs_openvino
def test_a_quantized_model_the_default_precision_cannot_compile_falls_back_to_f32(tiny_model_path, tmp_path, sample_feeds):
    import openvino as ov

    from devices.backends.openvino import OpenVinoBackend

    signed = _qdq_model(tiny_model_path, tmp_path, "QInt8")
    compiled = OpenVinoBackend().compile(signed, tmp_path / "signed", threads=1)
    try:
        # On CPUs whose default is f32 there is nothing to fall back from; either way the model runs.
        assert compiled.compiled.get_property("INFERENCE_PRECISION_HINT") in (ov.Type.f32, ov.Core().get_property(
            "CPU", "INFERENCE_PRECISION_HINT"))
        outputs = compiled.run(sample_feeds)["logits"]
    finally:
        compiled.close()
    reference = reference_logits(tiny_model_path, sample_feeds["input"])
    assert np.corrcoef(outputs.ravel(), reference.ravel())[0, 1] > 0.9


@needs_openvino
def test_an_fp32_model_with_an_integer_lookup_table_is_not_quantized(tmp_path):
    import onnx
    import openvino as ov
    from onnx import TensorProto, helper, numpy_helper

    from devices.backends.openvino import is_quantized, read_artifact

    table = numpy_helper.from_array(np.arange(40, dtype=np.uint8).reshape(10, 4), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"]), helper.make_node("Cast", ["rows"], ["out"], to=TensorProto.FLOAT)],
        "lookup", [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [3, 4])], [table])
    path = tmp_path / "lookup.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert not is_quantized(read_artifact(ov.Core(), path))
