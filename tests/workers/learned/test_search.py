"""`auto` proposes learned rounding only for a calibrated INT8 family faster than the best passing variant that misses the tolerance."""
from __future__ import annotations

from workers.quantize.search import plan_round

TOLERANCE = {"metric": "accuracy", "max_drop": 0.01}
FACTS = {"signature": {}, "op_histogram": {"Conv": 2, "Gemm": 1, "Relu": 2}}
VNNI = ["avx2", "avx512_vnni"]


def measured(key, p50, passed, backend="onnxruntime"):
    return {"key": key, "backend": backend, "precision": "fp32" if key == "fp32" else "int8", "latency_ms": {"p50": p50},
            "accuracy": {"metric": "accuracy", "value": 0.9 if passed else 0.5, "drop": 0.0 if passed else 0.4, "within_tolerance": passed}}


def round_two(*entries):
    specs = plan_round(round_number=2, model_facts=FACTS, device_isa=VNNI, backends=["onnxruntime"], has_calibration=True,
                       tolerance=TOLERANCE, sensitivity=[], measured=list(entries))
    return {spec["key"]: spec for spec in specs}


def test_a_fast_int8_family_that_misses_gets_a_learned_variant_with_its_own_calibration():
    specs = round_two(measured("fp32", 10.0, True), measured("int8-mse", 4.0, False), measured("int8-entropy", 5.0, False))
    learned = [spec for key, spec in specs.items() if key.endswith(("-adaround", "-qat"))]
    # Only the fastest missing family: each learned variant costs a training budget.
    assert [spec["key"] for spec in learned] == ["int8-mse-adaround", "int8-mse-qat"]
    for spec, method in zip(learned, ("adaround", "qat"), strict=True):
        options = spec["options"]
        assert options["learn"] == method and options["learn_seconds"] > 0
        assert options["calibration_method"] == "mse" and options["per_channel"] is True


def test_a_family_slower_than_the_best_passing_variant_is_not_learned():
    specs = round_two(measured("fp32", 3.0, True), measured("int8-mse", 4.0, False))
    assert not any(key.endswith(("-adaround", "-qat")) for key in specs)


def test_a_family_that_passes_on_some_backend_is_not_learned():
    specs = round_two(measured("fp32", 10.0, True), measured("int8-mse", 4.0, False), measured("int8-mse", 6.0, True, backend="openvino"))
    assert not any(key.endswith(("-adaround", "-qat")) for key in specs)


def test_a_learned_variant_is_proposed_once_and_never_refined():
    specs = round_two(measured("fp32", 10.0, True), measured("int8-mse", 4.0, False), measured("int8-mse-adaround", 4.0, False),
                      measured("int8-mse-qat", 4.2, False))
    assert not any(key.startswith(("int8-mse-adaround", "int8-mse-qat")) for key in specs)


def test_a_smoothed_transformer_family_that_misses_can_be_learned_on():
    facts = {"signature": {}, "op_histogram": {"MatMul": 8, "Add": 10, "LayerNormalization": 2, "Softmax": 1}}
    entries = [measured("fp32", 10.0, True), measured("int8-mse-transformer-smooth", 4.0, False), measured("int8-minmax", 4.5, False)]
    specs = plan_round(round_number=3, model_facts=facts, device_isa=VNNI, backends=["onnxruntime"], has_calibration=True,
                       tolerance=TOLERANCE, sensitivity=[], measured=entries)
    qat = {spec["key"]: spec for spec in specs}["int8-mse-transformer-smooth-qat"]["options"]
    assert qat["learn"] == "qat" and qat["smooth_quant"] == "auto" and qat["float_outputs"] == ["Gemm", "MatMul"]
