"""plan_round's rounds, tolerance parsing, and the local search end to end on the digits MLP."""

from __future__ import annotations

import pytest

from kiln.reports.noise import latency_ratio, timing_of
from workers.quantize import PRECISIONS
from workers.quantize.search import (
    InvalidTolerance,
    parse_tolerance,
    plan_round,
    search_locally,
)

CNN_FACTS = {"op_histogram": {"Conv": 2, "Relu": 2, "MaxPool": 2, "Flatten": 1, "Gemm": 1}}
TRANSFORMER_FACTS = {"op_histogram": {"MatMul": 8, "Add": 10, "LayerNormalization": 2, "Softmax": 1}}
VNNI = ["avx2", "avx512f", "avx512_vnni"]
TOLERANCE = {"metric": "accuracy", "max_drop": 0.01}
SENSITIVITY = [
    {"node": "conv2", "op_type": "Conv", "sqnr_db": 20.0, "relative_error": 0.1},
    {"node": "fc", "op_type": "Gemm", "sqnr_db": 30.0, "relative_error": 0.03},
    {"node": "conv1", "op_type": "Conv", "sqnr_db": 40.0, "relative_error": 0.01},
]


def _plan(round_number=1, *, facts=CNN_FACTS, isa=VNNI, measured=(), sensitivity=SENSITIVITY, calibration=True):
    return plan_round(round_number=round_number, model_facts=facts, device_isa=isa, backends=["onnxruntime", "openvino"],
                      has_calibration=calibration, tolerance=TOLERANCE, sensitivity=sensitivity, measured=list(measured))


def _measured(key, precision, p50, passed, backend="onnxruntime"):
    return {"key": key, "backend": backend, "precision": precision, "latency_ms": {"p50": p50},
            "accuracy": {"metric": "accuracy", "value": 0.9 if passed else 0.5, "drop": 0.0 if passed else 0.4,
                         "within_tolerance": passed}}


def test_round_one_sweeps_precisions_calibrations_and_tools():
    specs = _plan()
    keys = [spec["key"] for spec in specs]
    assert keys == ["fp32", "int8-dynamic", "int8-minmax", "int8-mse", "int8-entropy", "int8-nncf", "int4-rtn"]
    assert len(set(keys)) == len(keys)
    assert all(spec["precision"] in PRECISIONS for spec in specs)
    by_key = {spec["key"]: spec for spec in specs}
    assert by_key["int8-mse"]["options"]["calibration_method"] == "mse"
    assert by_key["int8-nncf"]["options"] == {"tool": "nncf"}
    # The CNN's only MatMul-able layer is a Gemm.
    assert by_key["int4-rtn"]["options"]["gemm_to_matmul"] is True


def test_round_one_picks_the_integer_scheme_from_isa_flags():
    vnni = {s["key"]: s for s in _plan(isa=VNNI)}["int8-mse"]["options"]
    avx2 = {s["key"]: s for s in _plan(isa=["avx2", "fma"])}["int8-mse"]["options"]
    sse = {s["key"]: s for s in _plan(isa=["sse4_2"])}["int8-mse"]["options"]
    assert (vnni["activation_type"], vnni["weight_type"], vnni["reduce_range"]) == ("uint8", "int8", False)
    assert (avx2["activation_type"], avx2["weight_type"], avx2["reduce_range"]) == ("uint8", "int8", True)
    assert (sse["activation_type"], sse["weight_type"]) == ("uint8", "uint8")


def test_round_one_for_a_transformer_adds_the_float_layernorm_recipe_and_nncf_transformer_type():
    specs = {s["key"]: s for s in _plan(facts=TRANSFORMER_FACTS)}
    assert specs["int8-mse-transformer"]["options"]["op_types_to_quantize"] == ["MatMul", "Gemm", "Conv"]
    assert specs["int8-nncf"]["options"] == {"tool": "nncf"}  # the vendor default stays in the sweep
    assert specs["int8-nncf-transformer"]["options"]["model_type"] == "transformer"
    assert "gemm_to_matmul" not in specs["int4-rtn"]["options"]


def test_round_one_without_calibration_has_no_static_int8():
    keys = [s["key"] for s in _plan(calibration=False)]
    assert keys == ["fp32", "int8-dynamic", "int4-rtn"]


def test_a_fast_int8_that_misses_gets_its_most_sensitive_node_kept_in_float():
    measured = [_measured("fp32", "fp32", 10.0, True), _measured("int8-mse", "int8", 4.0, False),
                _measured("int8-minmax", "int8", 12.0, False)]
    specs = _plan(2, measured=measured)
    assert [s["key"] for s in specs] == ["int8-mse-keep1"]
    assert specs[0]["options"]["nodes_to_exclude"] == ["conv2"]
    assert specs[0]["options"]["calibration_method"] == "mse"
    # Still missing after keep1: round 3 doubles the float set.
    measured.append(_measured("int8-mse-keep1", "int8", 5.0, False))
    specs = _plan(3, measured=measured)
    assert [s["key"] for s in specs] == ["int8-mse-keep2"]
    assert specs[0]["options"]["nodes_to_exclude"] == ["conv2", "fc"]


def test_nothing_left_when_the_tolerance_is_met_and_no_faster_candidate_remains():
    measured = [_measured("fp32", "fp32", 10.0, True), _measured("int8-mse", "int8", 4.0, False),
                _measured("int8-mse-keep1", "int8", 5.0, True), _measured("int8-minmax", "int8", 12.0, False)]
    assert _plan(3, measured=measured) == []
    # INT8 slower than FP32 (no VNNI, broken fusion) is never refined: it cannot win.
    slow = [_measured("fp32", "fp32", 10.0, True), _measured("int8-mse", "int8", 11.0, False)]
    assert _plan(2, measured=slow) == []


def test_int4_miss_moves_the_most_int4_sensitive_weights_to_int8():
    sensitivity = [{"node": "fc1", "op_type": "MatMul", "sqnr_db": 40.0, "relative_error": 0.01, "int4_sqnr_db": 30.0},
                   {"node": "fc2", "op_type": "MatMul", "sqnr_db": 30.0, "relative_error": 0.03, "int4_sqnr_db": 20.0}]
    measured = [_measured("fp32", "fp32", 10.0, True), _measured("int4-rtn", "int4-weight", 3.0, False)]
    specs = _plan(2, facts=TRANSFORMER_FACTS, measured=measured, sensitivity=sensitivity)
    assert [s["key"] for s in specs] == ["int4-mix1"]
    assert specs[0]["options"]["int8_nodes"] == ["fc2"]


def test_plans_are_deterministic():
    measured = [_measured("fp32", "fp32", 10.0, True), _measured("int8-mse", "int8", 4.0, False),
                _measured("int8-entropy", "int8", 4.5, False, backend="openvino")]
    assert _plan(2, measured=measured) == _plan(2, measured=list(reversed(measured)))


@pytest.mark.parametrize("text, expected", [
    ("1%", {"metric": "auto", "max_drop": 0.01}),
    ("accuracy:0.5%", {"metric": "accuracy", "max_drop": 0.005}),
    ({"metric": "cosine", "max_drop": "0.02"}, {"metric": "cosine", "max_drop": 0.02}),
    ({"metric": "sqnr", "min_value": 25}, {"metric": "sqnr", "min_value": 25.0}),
    (0.01, {"metric": "auto", "max_drop": 0.01}),
])
def test_tolerances_parse(text, expected):
    assert parse_tolerance(text) == expected


@pytest.mark.parametrize("bad, message", [
    ("about one percent", "tolerance.max_drop must be a number, got 'about one percent'"),
    ({"metric": "f1", "max_drop": 0.01}, "Unknown tolerance metric 'f1'"),
    ({"max_drop": 5}, "max_drop must be between 0 and 1"),
    ({"max_drop": "nan"}, "must be finite"),
    (["1%"], "tolerance must be an object"),
])
def test_unparseable_tolerances_get_a_clear_message(bad, message):
    with pytest.raises(InvalidTolerance, match=message):
        parse_tolerance(bad)
    with pytest.raises(InvalidTolerance):
        plan_round(round_number=1, model_facts=CNN_FACTS, device_isa=VNNI, backends=["onnxruntime"],
                   has_calibration=True, tolerance=bad, sensitivity=None, measured=[])


def test_search_locally_recommends_a_variant_within_tolerance(mlp_path, mlp_calibration, mlp_validation, tmp_path):
    result = search_locally(model_path=mlp_path, calibration_path=mlp_calibration, validation_path=mlp_validation,
                            tolerance="accuracy:1%", backends=("onnxruntime",), work_dir=tmp_path, max_rounds=2,
                            benchmark={"warmup_runs": 2, "warmup_seconds": 0.0, "min_runs": 5, "min_seconds": 0.0})
    by_id = {entry["id"]: entry for entry in result["variants"]}
    assert "fp32@onnxruntime" in by_id and "int8-mse@onnxruntime" in by_id
    best = by_id[result["recommended"]]
    assert best["accuracy"]["within_tolerance"]
    # The fastest within tolerance, or one it does not beat beyond the measured noise (reports/noise.py).
    fastest = min((e for e in by_id.values() if e["accuracy"]["within_tolerance"]), key=lambda e: e["latency_ms"]["p50"])
    assert best is fastest or not latency_ratio(timing_of(fastest), timing_of(best)).beyond_noise
    assert result["reason"].startswith(f"Use {best['key']} on onnxruntime")
    assert result["sensitivity"][0]["node"] in {"fc1", "fc2", "fc3"}
    assert result["recommended"] in result["pareto"]


def test_round_one_keeps_a_clear_outlier_in_float_with_only_compute_ops_quantized():
    from workers.quantize.search import plan_round, sensitivity_outliers

    ranking = [
        {"node": "spiky", "op_type": "MatMul", "sqnr_db": 2.0},
        {"node": "l0", "op_type": "MatMul", "sqnr_db": 40.0},
        {"node": "l1", "op_type": "MatMul", "sqnr_db": 41.0},
        {"node": "l2", "op_type": "MatMul", "sqnr_db": 43.0},
    ]
    assert sensitivity_outliers(ranking) == ["spiky"]
    specs = plan_round(round_number=1, model_facts={"op_histogram": {"MatMul": 4}}, device_isa=["avx2"], backends=["onnxruntime"],
                       has_calibration=True, tolerance={"metric": "cosine", "max_drop": 0.001}, sensitivity=ranking, measured=[])
    keep = [s for s in specs if s["key"].endswith("-keep1")]
    assert len(keep) == 1
    assert keep[0]["options"]["nodes_to_exclude"] == ["spiky"]
    assert set(keep[0]["options"]["op_types_to_quantize"]) <= {"Conv", "ConvTranspose", "MatMul", "Gemm"}


def test_round_one_adds_nothing_when_no_node_stands_out():
    from workers.quantize.search import plan_round, sensitivity_outliers

    ranking = [{"node": f"l{i}", "op_type": "MatMul", "sqnr_db": 38.0 + i} for i in range(4)]
    assert sensitivity_outliers(ranking) == []
    specs = plan_round(round_number=1, model_facts={"op_histogram": {"MatMul": 4}}, device_isa=["avx2"], backends=["onnxruntime"],
                       has_calibration=True, tolerance={"metric": "cosine", "max_drop": 0.01}, sensitivity=ranking, measured=[])
    assert not [s for s in specs if "-keep" in s["key"]]
