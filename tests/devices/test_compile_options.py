"""Compile options: parsed once, applied by both runtimes, and they change speed, never the outputs."""

from __future__ import annotations

import numpy as np
import pytest

from devices.backends.options import InvalidCompileOptions, describe, parse_compile_options
from devices.backends.registry import get_backend
from tests.devices.conftest import reference_logits
from tests.devices.test_backends import BACKENDS, HAS_OPENVINO

STATIC = {"static_shapes": {"input": [1, 1, 8, 8]}}


def test_options_parse_to_a_canonical_form():
    raw = {"static_shapes": {"input": [1, 1, 8, 8]}, "threads": 2, "graph_optimization": "extended",
           "performance_hint": "THROUGHPUT", "inference_precision": "bf16"}
    assert parse_compile_options(raw) == raw
    assert parse_compile_options(None) == {} == parse_compile_options({})
    assert describe(raw) == "static input 1x1x8x8, 2 threads, ORT level extended, hint THROUGHPUT, precision hint bf16"
    assert describe({}) == "runtime defaults"


@pytest.mark.parametrize("raw, message", [
    ({"static": True}, "unknown compile option"),
    ({"threads": 0}, "threads must be an integer from 1"),
    ({"threads": True}, "threads must be an integer"),
    ({"graph_optimization": "max"}, "graph_optimization must be one of basic, extended, all"),
    ({"performance_hint": "FAST"}, "performance_hint must be one of"),
    ({"inference_precision": "f16"}, "inference_precision must be one of f32, bf16"),
    ({"static_shapes": {"input": [1, -1]}}, "every dimension must be an integer from 1"),
    ({"static_shapes": []}, "static_shapes must map"),
    ("fast", "compile options must be an object"),
])
def test_bad_options_are_refused_with_the_key_named(raw, message):
    with pytest.raises(InvalidCompileOptions, match=message):
        parse_compile_options(raw)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_static_shapes_specialise_the_dynamic_batch_and_keep_the_outputs(backend_name, tiny_model_path, tmp_path, sample_feeds):
    compiled = get_backend(backend_name).compile(tiny_model_path, tmp_path / "static", threads=1, options=STATIC)
    try:
        assert compiled.input_specs[0].shape == (1, 1, 8, 8)
        outputs = compiled.run(sample_feeds)["logits"]
        np.testing.assert_allclose(outputs, reference_logits(tiny_model_path, sample_feeds["input"]), rtol=1e-4, atol=1e-5)
    finally:
        compiled.close()


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_static_shapes_for_an_unknown_input_fail_clearly(backend_name, tiny_model_path, tmp_path):
    with pytest.raises(ValueError, match="static_shapes names no input of the model: pixels"):
        get_backend(backend_name).compile(tiny_model_path, tmp_path / "bad", options={"static_shapes": {"pixels": [1, 1, 8, 8]}})


def test_static_shapes_that_contradict_a_fixed_dimension_fail_clearly(tiny_model_path, tmp_path):
    with pytest.raises(ValueError, match="contradicts its fixed dimension 8"):
        get_backend("onnxruntime").compile(tiny_model_path, tmp_path / "bad", options={"static_shapes": {"input": [1, 1, 9, 8]}})


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_the_threads_option_wins_over_the_argument(backend_name, tiny_model_path, tmp_path):
    compiled = get_backend(backend_name).compile(tiny_model_path, tmp_path / "threads", threads=2, options={"threads": 1})
    try:
        assert compiled.threads == 1
    finally:
        compiled.close()


@pytest.mark.parametrize("backend_name, options", [
    ("onnxruntime", {"graph_optimization": "basic"}),
    ("onnxruntime", {"graph_optimization": "extended"}),
    ("openvino", {"performance_hint": "THROUGHPUT"}),
])
def test_runtime_hints_keep_the_outputs(backend_name, options, tiny_model_path, tmp_path, sample_feeds):
    if backend_name == "openvino" and not HAS_OPENVINO:
        pytest.skip("openvino is not installed (pip install kiln-agent[openvino])")
    compiled = get_backend(backend_name).compile(tiny_model_path, tmp_path / "hint", threads=1, options=options)
    try:
        outputs = compiled.run(sample_feeds)["logits"]
        np.testing.assert_allclose(outputs, reference_logits(tiny_model_path, sample_feeds["input"]), rtol=1e-4, atol=1e-5)
    finally:
        compiled.close()
