"""The OpenVINO INT8 family is planned for targets that offer OpenVINO, with calibration data: explicit and `auto`."""
from __future__ import annotations

from workers.quantize.openvino_family import explicit_specs
from workers.quantize.search import plan_round

CNN_FACTS = {"op_histogram": {"Conv": 2, "Relu": 2, "Gemm": 1}}
TRANSFORMER_FACTS = {"op_histogram": {"MatMul": 8, "Add": 10, "LayerNormalization": 2, "Softmax": 1}}
TOLERANCE = {"metric": "cosine", "max_drop": 0.01}


def _keys(specs):
    return [spec["key"] for spec in specs]


def _plan(*, backends, facts=CNN_FACTS, calibration=True, round_number=1):
    return plan_round(round_number=round_number, model_facts=facts, device_isa=["avx2"], backends=list(backends),
                      has_calibration=calibration, tolerance=TOLERANCE, sensitivity=None, measured=[])


def test_explicit_int8_gets_an_openvino_ir_build_only_for_openvino_targets_with_calibration():
    specs = explicit_specs(["fp32", "int8", "int8-dynamic"], backends={"onnxruntime", "openvino"}, has_calibration=True)
    assert [(s["key"], s["precision"], s["options"], s["backends"]) for s in specs] == [
        ("ov-int8", "int8", {"runtime": "openvino"}, ["openvino"])]
    assert explicit_specs(["int8"], backends={"onnxruntime"}, has_calibration=True) == []
    assert explicit_specs(["int8"], backends={"openvino"}, has_calibration=False) == []


def test_auto_round_one_measures_nncfs_openvino_int8_on_openvino_and_no_qdq_file_there():
    specs = {spec["key"]: spec for spec in _plan(backends=["openvino"])}
    assert "ov-int8" in specs and specs["ov-int8"]["backends"] == ["openvino"]
    assert not [key for key, spec in specs.items() if spec["precision"] == "int8" and key != "ov-int8"]
    assert "ov-int8-transformer" in _keys(_plan(backends=["openvino"], facts=TRANSFORMER_FACTS))
    assert not any(key.startswith("ov-") for key in _keys(_plan(backends=["onnxruntime"])))
    assert not any(key.startswith("ov-") for key in _keys(_plan(backends=["openvino"], calibration=False)))
