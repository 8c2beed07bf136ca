"""Which runtimes a planned variant runs on: static INT8's QDQ file is ONNX Runtime's, an IR OpenVINO's, a flatbuffer LiteRT's."""
from __future__ import annotations

from workers.quantize.litert_family import litert_spec
from workers.quantize.openvino_family import openvino_spec
from workers.quantize.runtimes import for_targets, spec_runtimes

BOTH = {"onnxruntime", "openvino"}


def test_an_onnx_build_runs_on_every_onnx_runtime_but_static_int8_on_onnx_runtime_alone():
    assert spec_runtimes({"key": "fp32", "precision": "fp32"}) == ("onnxruntime", "openvino")
    assert spec_runtimes({"key": "int8-dynamic", "precision": "int8-dynamic"}) == ("onnxruntime", "openvino")
    assert spec_runtimes({"key": "int8-nncf", "precision": "int8", "options": {"tool": "nncf"}}) == ("onnxruntime",)
    # A planner naming OpenVINO for a QDQ recipe does not make OpenVINO run it.
    assert spec_runtimes({"key": "int8-mse", "precision": "int8", "backends": ["openvino", "onnxruntime"]}) == ("onnxruntime",)
    assert spec_runtimes(openvino_spec()) == ("openvino",)
    assert spec_runtimes(litert_spec("int8")) == ("litert",)


def test_for_targets_names_the_runtimes_of_a_narrowed_build_and_drops_what_no_target_runs():
    fp32, int8 = {"key": "fp32", "precision": "fp32"}, {"key": "int8", "precision": "int8"}
    # FP32 runs wherever its build loads; a QDQ INT8 build is given to ONNX Runtime only, never to OpenVINO.
    assert for_targets([fp32, int8, openvino_spec()], BOTH) == [fp32, {**int8, "backends": ["onnxruntime"]}, openvino_spec()]
    assert for_targets([fp32, int8, openvino_spec()], {"openvino"}) == [fp32, openvino_spec()]
    assert for_targets([int8, openvino_spec()], {"onnxruntime"}) == [{**int8, "backends": ["onnxruntime"]}]
