"""A variant's label names what runs: the effective precision first, the recipe and compile options after it."""
from __future__ import annotations

import pytest

from kiln_contract.labels import effective_precision, ignored_options, variant_label


@pytest.mark.parametrize(("precision", "compile_options", "backend", "options", "effective"), [
    ("fp32", {}, "onnxruntime", {}, "fp32"),
    ("fp32", {"inference_precision": "bf16", "static_shapes": {"x": [1, 3]}}, "openvino", {}, "bf16"),
    ("fp32", {"inference_precision": "bf16"}, "onnxruntime", {}, "fp32"),  # ORT's CPU provider has no such hint
    ("fp32", {"inference_precision": "f32"}, "openvino", {}, "fp32"),
    ("fp16", {}, "onnxruntime", {}, "fp16"),
    ("int8", {}, "onnxruntime", {"calibration_method": "mse"}, "int8"),
    ("int8-dynamic", {}, "onnxruntime", {}, "int8"),
    ("int8", {}, "onnxruntime", {"nodes_to_exclude": ["conv1"]}, "mixed"),
    ("int4-weight", {}, "onnxruntime", {"block_size": 32}, "int4 weights"),
    ("int4-weight", {}, "onnxruntime", {"int8_nodes": ["fc"]}, "mixed"),
    ("int4-weight", {}, "openvino", {"ratio": 0.8}, "mixed"),
    # NNCF's OpenVINO IR runs its quantized operations in INT8 whatever the float remainder runs in (never "fp32").
    ("int8", {}, "openvino", {"runtime": "openvino"}, "int8"),
    ("int8", {"inference_precision": "bf16"}, "openvino", {"runtime": "openvino"}, "int8"),
])
def test_the_effective_precision_is_what_the_device_computes_in(precision, compile_options, backend, options, effective):
    assert effective_precision(precision, compile_options, backend, options) == effective


def test_labels_lead_with_the_effective_precision_and_end_with_the_compile_options():
    assert variant_label(key="fp32+static+ov-bf16", precision="fp32", backend="openvino",
                         compile_options={"inference_precision": "bf16", "static_shapes": {"x": [1]}}) == "bf16 · fp32+static+ov-bf16 on openvino"
    assert variant_label(key="bf16+static", precision="fp32", backend="openvino",
                         compile_options={"inference_precision": "bf16", "static_shapes": {"x": [1]}}) == "bf16 +static on openvino"
    assert variant_label(key="fp32+threads2", precision="fp32", backend="onnxruntime", compile_options={"threads": 2}) == "fp32 +threads2 on onnxruntime"
    assert variant_label(key="int8-mse-keep4", precision="int8", backend="onnxruntime",
                         options={"nodes_to_exclude": ["a", "b", "c", "d"]}) == "mixed · int8-mse-keep4 on onnxruntime"
    assert variant_label(key=None, precision="fp32", backend="onnxruntime") == "fp32 on onnxruntime"
    assert variant_label(key="ov-int8", precision="int8", backend="openvino", options={"runtime": "openvino"}) == "int8 · ov-int8 on openvino"


def test_options_a_backend_does_not_act_on_are_named():
    assert ignored_options("onnxruntime", {"inference_precision": "bf16", "threads": 2}) == ["inference_precision"]
    assert ignored_options("openvino", {"graph_optimization": "extended", "performance_hint": "THROUGHPUT"}) == ["graph_optimization"]
    assert ignored_options("tensorrt", {"anything": 1}) == []
