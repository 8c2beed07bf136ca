"""OpenVINO INT8 variants: NNCF on OpenVINO's own model, kept as an IR that OpenVINO alone runs."""

from __future__ import annotations

import importlib.util
import tarfile

import numpy as np
import pytest

from devices.artifacts import IR_WEIGHTS, IR_XML, OPENVINO_IR, artifact_format
from kiln_contract.metrics import cosine_similarity
from workers.quantize import QuantizationError, build_variant

pytestmark = pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="openvino is not installed")

OPENVINO_INT8 = {"runtime": "openvino"}


@pytest.fixture(scope="module")
def ir_variant(digits_path, digits_calibration, tmp_path_factory):
    out = tmp_path_factory.mktemp("ov-int8") / "ov-int8.openvino.tar"
    built = build_variant(model_path=digits_path, precision="int8", out_path=out, calibration_path=digits_calibration,
                          options=OPENVINO_INT8)
    return out, built


def _op_types(model) -> set[str]:
    return {op.get_type_name() for op in model.get_ordered_ops()}


def test_the_openvino_int8_variant_is_an_ir_with_fake_quantize_nodes_for_openvino_alone(ir_variant):
    import openvino as ov

    from devices.backends.openvino import read_artifact

    out, built = ir_variant
    assert built["format"] == artifact_format(out) == OPENVINO_IR
    assert built["backends"] == ["openvino"]
    assert built["recipe"]["tool"].startswith("nncf") and "OpenVINO backend" in built["recipe"]["tool"]
    with tarfile.open(out) as archive:
        assert sorted(archive.getnames()) == sorted([IR_XML, IR_WEIGHTS])
    assert built["size_bytes"] == out.stat().st_size
    assert "FakeQuantize" in _op_types(read_artifact(ov.Core(), out))


def test_openvino_runs_the_ir_in_int8_and_agrees_with_fp32(ir_variant, digits, digits_path, tmp_path):
    from devices.backends.openvino import OpenVinoBackend

    out, _ = ir_variant
    backend = OpenVinoBackend()
    fp32 = backend.compile(digits_path, tmp_path / "fp32", threads=1)
    int8 = backend.compile(out, tmp_path / "int8", threads=1)
    try:
        runtime_precisions = {
            op.get_rt_info()["layerType"].astype(str): op.get_rt_info()["runtimePrecision"].astype(str)
            for op in int8.compiled.get_runtime_model().get_ordered_ops()
        }
        # The CPU plugin turns FakeQuantize + Convolution into an integer convolution.
        assert runtime_precisions["Convolution"] in ("u8", "i8")
        assert int8.input_names == ["input"] and int8.output_names == ["logits"]
        reference = fp32.run({"input": digits.x_val})["logits"]
        logits = int8.run({"input": digits.x_val})["logits"]
    finally:
        fp32.close()
        int8.close()
    # What the issue saw go wrong: a QDQ file that OpenVINO read into garbage (cosine near 0).
    assert cosine_similarity(logits, reference) > 0.99
    assert (logits.argmax(1) == reference.argmax(1)).mean() >= 0.98
    assert (logits.argmax(1) == digits.y_val).mean() >= digits.fp32_accuracy - 0.02


def test_an_openvino_build_refuses_other_precisions_options_and_tools(digits_path, digits_calibration, tmp_path):
    out = tmp_path / "x.openvino.tar"
    with pytest.raises(ValueError, match="OpenVINO IR build makes int8"):
        build_variant(model_path=digits_path, precision="fp16", out_path=out, options=OPENVINO_INT8)
    with pytest.raises(ValueError, match="takes no calibration_method"):
        build_variant(model_path=digits_path, precision="int8", out_path=out, calibration_path=digits_calibration,
                      options={**OPENVINO_INT8, "calibration_method": "mse"})
    with pytest.raises(ValueError, match="tool: nncf"):
        build_variant(model_path=digits_path, precision="int8", out_path=out, calibration_path=digits_calibration,
                      options={**OPENVINO_INT8, "tool": "onnxruntime"})
    assert not out.exists()


def test_an_openvino_build_needs_enough_calibration_samples(digits, digits_path, tmp_path):
    from tests.fixtures.models import write_npz

    few = write_npz(tmp_path / "few.npz", input=np.ascontiguousarray(digits.x_calib[:3]))
    with pytest.raises(QuantizationError, match="3 samples"):
        build_variant(model_path=digits_path, precision="int8", out_path=tmp_path / "x.openvino.tar", calibration_path=few,
                      options=OPENVINO_INT8)
    with pytest.raises(QuantizationError, match="calibration dataset"):
        build_variant(model_path=digits_path, precision="int8", out_path=tmp_path / "x.openvino.tar", options=OPENVINO_INT8)
