"""The LiteRT family is planned only for targets that offer LiteRT: explicit precisions and the `auto` search."""
from __future__ import annotations

from workers.quantize.litert_family import explicit_specs, litert_spec
from workers.quantize.runtimes import for_targets
from workers.quantize.search import plan_round

CNN_FACTS = {"op_histogram": {"Conv": 2, "Relu": 2, "Gemm": 1}, "dynamic_inputs": ["input"], "data_shapes": {"input": [1, 1, 8, 8]}}
TOLERANCE = {"metric": "cosine", "max_drop": 0.01}
FP16_ISA = ["avx2", "avx512f", "avx512_fp16"]


def _plan(round_number=1, *, backends, isa=("avx2",), calibration=True, measured=(), threads=None):
    return plan_round(round_number=round_number, model_facts=CNN_FACTS, device_isa=list(isa), backends=list(backends),
                      has_calibration=calibration, tolerance=TOLERANCE, sensitivity=None, measured=list(measured),
                      thread_choices=threads)


def _measured(key, precision, p50, backend, compile=None):
    options = {"runtime": "litert"} if backend == "litert" else {}
    return {"key": key, "id": f"{key}@{backend}", "backend": backend, "precision": precision, "options": options, "compile": compile or {},
            "latency_ms": {"p50": p50, "cv": 0.02, "count": 50},
            "accuracy": {"metric": "cosine", "value": 0.999, "drop": 0.001, "within_tolerance": True}}


def test_explicit_precisions_get_litert_builds_only_where_a_target_offers_litert():
    assert explicit_specs(["fp32", "int8"], backends={"onnxruntime"}, has_calibration=True) == []
    specs = explicit_specs(["fp32", "fp16", "int8", "int8-dynamic", "int4-weight"], backends={"onnxruntime", "litert"}, has_calibration=True)
    assert [(s["key"], s["precision"], s["options"], s["backends"]) for s in specs] == [
        ("litert-fp32", "fp32", {"runtime": "litert"}, ["litert"]), ("litert-fp16", "fp16", {"runtime": "litert"}, ["litert"]),
        ("litert-int8", "int8", {"runtime": "litert"}, ["litert"])]
    # Full-integer INT8 is calibrated: without calibration data it is not planned.
    assert [s["key"] for s in explicit_specs(["fp32", "int8"], backends={"litert"}, has_calibration=False)] == ["litert-fp32"]


def test_nothing_is_built_for_a_runtime_no_target_has():
    onnx_fp32 = {"key": "fp32", "precision": "fp32"}
    assert for_targets([onnx_fp32, litert_spec("fp32")], {"litert"}) == [litert_spec("fp32")]
    assert for_targets([onnx_fp32, litert_spec("fp32")], {"openvino"}) == [onnx_fp32]
    assert for_targets([{**onnx_fp32, "backends": ["openvino"]}], {"onnxruntime"}) == []


def test_auto_round_one_proposes_litert_fp32_and_int8_beside_the_onnx_family_when_a_target_has_litert():
    mixed = {spec["key"]: spec for spec in _plan(backends=["onnxruntime", "litert"])}
    # LiteRT's full-integer INT8 is that runtime's own default: measured even without integer dot products (AVX2 here),
    # like ONNX Runtime's (workers.quantize.isa_families).
    assert {"fp32", "int8-ort-default", "litert-fp32", "litert-int8"} <= set(mixed)
    assert mixed["litert-int8"]["backends"] == ["litert"] and mixed["litert-int8"]["options"] == {"runtime": "litert"}
    assert "litert-fp16" not in mixed  # no FP16 arithmetic in these ISA flags
    assert "litert-fp16" in _keys(_plan(backends=["litert"], isa=FP16_ISA))
    # A LiteRT-only fleet gets nothing an ONNX runtime would have to run.
    assert sorted(_keys(_plan(backends=["litert"]))) == ["litert-fp32", "litert-int8"]
    assert not any(key.startswith("litert") for key in _keys(_plan(backends=["onnxruntime", "openvino"])))
    assert _keys(_plan(backends=["litert"], calibration=False)) == ["litert-fp32"]


def test_later_rounds_try_thread_counts_on_the_fastest_litert_build_but_never_static_shapes():
    measured = [_measured("litert-fp32", "fp32", 10.0, "litert"), _measured("litert-int8", "int8", 4.0, "litert")]
    specs = {spec["key"]: spec for spec in _plan(2, backends=["litert"], measured=measured, threads=[1, 2])}
    # The shapes are fixed when the flatbuffer is built: a "static" variant would measure the same thing twice.
    assert set(specs) == {"litert-int8+threads1", "litert-int8+threads2"}
    assert specs["litert-int8+threads2"]["options"] == {"runtime": "litert"} and specs["litert-int8+threads2"]["backends"] == ["litert"]


def _keys(specs):
    return [spec["key"] for spec in specs]
