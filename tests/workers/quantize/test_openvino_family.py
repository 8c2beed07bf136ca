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


def _entry(key, p50, passed, compile=None):
    return {"key": key, "id": f"{key}@openvino", "backend": "openvino", "precision": "fp32" if key.startswith("fp32") else "int8",
            "options": {"runtime": "openvino"} if key.startswith("ov-") else {}, "compile": compile or {},
            "latency_ms": {"p50": p50, "cv": 0.02, "count": 50},
            "accuracy": {"metric": "top1_agreement", "value": 1.0 if passed else 0.875, "drop": 0.0 if passed else 0.125,
                         "within_tolerance": passed}}


def test_a_model_whose_default_openvino_int8_misses_but_wins_gets_nncfs_transformer_type_in_round_two():
    """Magika (2026-12-07): a LayerNorm exported as Sub/Square/Mul is no transformer by its op types, NNCF's default preset
    quantizes those elementwise ops and misses (0.875), and the transformer type keeps them float and passes."""
    fp32, bf16 = _entry("fp32", 8.0, True), _entry("fp32", 4.2, True, compile={"inference_precision": "bf16"})
    missed = _entry("ov-int8", 3.4, False)

    def round_two(measured):
        return {spec["key"]: spec for spec in plan_round(round_number=2, model_facts=CNN_FACTS, device_isa=["avx2", "avx512_vnni"],
                                                         backends=["openvino"], has_calibration=True, tolerance=TOLERANCE,
                                                         sensitivity=None, measured=measured)}

    specs = round_two([fp32, bf16, missed])
    assert specs["ov-int8-transformer"]["options"] == {"runtime": "openvino", "model_type": "transformer"}
    assert specs["ov-int8-transformer"]["backends"] == ["openvino"]
    # Not when the default passes, nor when it cannot beat what already passes.
    assert "ov-int8-transformer" not in round_two([fp32, bf16, _entry("ov-int8", 3.4, True)])
    assert "ov-int8-transformer" not in round_two([fp32, bf16, _entry("ov-int8", 4.5, False)])
    # Once measured, it is not proposed again.
    assert "ov-int8-transformer" not in round_two([fp32, bf16, missed, _entry("ov-int8-transformer", 3.3, True)])
