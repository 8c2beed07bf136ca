import importlib.util

import numpy as np
import onnx
import pytest

from devices.backends import BackendUnavailable, available_backends, get_backend
from devices.backends.onnxruntime import parse_ort_trace

from .conftest import reference_logits

HAS_OPENVINO = importlib.util.find_spec("openvino") is not None
BACKENDS = [
    "onnxruntime",
    pytest.param("openvino", marks=pytest.mark.skipif(
        not HAS_OPENVINO, reason="openvino is not installed (pip install kiln-agent[openvino])")),
]


@pytest.fixture(params=BACKENDS)
def compiled(request, tiny_model_path, tmp_path):
    model = get_backend(request.param).compile(tiny_model_path, tmp_path / request.param, threads=1)
    yield model
    model.close()


def test_compile_writes_an_artifact(compiled, tmp_path):
    assert compiled.artifact_path.is_file()
    assert compiled.artifact_path.stat().st_size > 0
    assert compiled.artifact_path.is_relative_to(tmp_path)


def test_compiled_model_describes_its_signature(compiled):
    assert compiled.input_names == ["input"]
    assert compiled.output_names == ["logits"]
    spec = compiled.input_specs[0]
    assert spec.dtype == np.float32
    assert spec.shape == (None, 1, 8, 8)
    assert compiled.threads == 1


def test_run_matches_the_fp32_reference(compiled, tiny_model_path):
    inputs = np.random.default_rng(3).standard_normal((3, 1, 8, 8)).astype(np.float32)
    outputs = compiled.run({"input": inputs})
    assert set(outputs) == {"logits"}
    assert outputs["logits"].shape == (3, 10)
    np.testing.assert_allclose(outputs["logits"], reference_logits(tiny_model_path, inputs),
                               rtol=1e-4, atol=1e-4)


def test_bind_runs_the_model(compiled, sample_feeds):
    run = compiled.bind(sample_feeds)
    run()
    run()


def test_profile_has_op_types_and_nodes(compiled, sample_feeds):
    profile = compiled.profile(sample_feeds, runs=3)
    assert (profile["runs"], profile["warmup_runs"]) == (3, 1)
    op_types = {row["op_type"] for row in profile["by_op_type"]}
    assert op_types, profile
    assert any("conv" in op_type.lower() for op_type in op_types)
    assert sum(row["share"] for row in profile["by_op_type"]) == pytest.approx(1.0)
    assert all(set(row) == {"op_type", "time_ms", "share", "count"} for row in profile["by_op_type"])
    assert 0 < len(profile["by_node"]) <= 50
    assert all({"name", "op_type", "time_ms", "share"} <= set(row) <= {"name", "op_type", "time_ms", "share", "layers"} for row in profile["by_node"])
    times = [row["time_ms"] for row in profile["by_op_type"]]
    assert times == sorted(times, reverse=True)


def test_parse_ort_trace_sums_kernel_time_per_node_and_op_type():
    trace = [
        {"cat": "Session", "name": "model_run", "dur": 999},
        {"cat": "Node", "name": "conv_kernel_time", "dur": 300, "args": {"op_name": "Conv"}},
        {"cat": "Node", "name": "conv_fence_before", "dur": 5, "args": {"op_name": "Conv"}},
        {"cat": "Node", "name": "conv2_kernel_time", "dur": 100, "args": {"op_name": "Conv"}},
        {"cat": "Node", "name": "relu_kernel_time", "dur": 100, "args": {"op_name": "Relu"}},
        {"cat": "Node", "name": "conv_kernel_time", "dur": 300, "args": {"op_name": "Conv"}},
    ]
    profile = parse_ort_trace(trace, runs=2)
    conv, relu = profile["by_op_type"]
    assert (conv["op_type"], conv["count"], relu["op_type"], relu["count"]) == ("Conv", 2, "Relu", 1)
    assert conv["time_ms"] == pytest.approx(0.35) and conv["share"] == pytest.approx(0.875)
    assert relu["time_ms"] == pytest.approx(0.05) and relu["share"] == pytest.approx(0.125)
    top = profile["by_node"][0]
    assert (top["name"], top["op_type"]) == ("conv", "Conv")
    assert top["time_ms"] == pytest.approx(0.3) and top["share"] == pytest.approx(0.75)


def test_parse_ort_trace_leaves_out_the_warm_up_runs():
    trace = [
        {"cat": "Session", "name": "model_run", "ts": 100, "dur": 50},
        {"cat": "Node", "name": "conv_kernel_time", "ts": 110, "dur": 900, "args": {"op_name": "Conv"}},
        {"cat": "Session", "name": "model_run", "ts": 200, "dur": 50},
        {"cat": "Node", "name": "conv_kernel_time", "ts": 210, "dur": 100, "args": {"op_name": "Conv"}},
        {"cat": "Session", "name": "model_run", "ts": 300, "dur": 50},
        {"cat": "Node", "name": "conv_kernel_time", "ts": 310, "dur": 300, "args": {"op_name": "Conv"}},
    ]
    profile = parse_ort_trace(trace, runs=2, warmup_runs=1)
    assert (profile["runs"], profile["warmup_runs"]) == (2, 1)
    assert profile["by_op_type"][0]["time_ms"] == pytest.approx(0.2)
    # Without timed runs to tell the warm-up apart, every run is counted and none is called warm-up.
    untimed = [{key: value for key, value in event.items() if key != "ts"} for event in trace]
    whole = parse_ort_trace(untimed, runs=2, warmup_runs=1)
    assert (whole["runs"], whole["warmup_runs"]) == (3, 0)
    assert whole["by_op_type"][0]["time_ms"] == pytest.approx(1300 / 3 / 1000)


def test_static_batch_model_reports_its_batch(static_batch_model_path, tmp_path):
    compiled = get_backend("onnxruntime").compile(static_batch_model_path, tmp_path)
    assert compiled.input_specs[0].static_batch == 4


def test_backends_env_restricts_what_is_offered(monkeypatch):
    monkeypatch.setenv("KILN_AGENT_BACKENDS", "onnxruntime")
    assert set(available_backends()) == {"onnxruntime"}
    with pytest.raises(BackendUnavailable, match="KILN_AGENT_BACKENDS"):
        get_backend("openvino")


def test_unknown_backend_is_unavailable():
    with pytest.raises(BackendUnavailable, match="unknown"):
        get_backend("tflite")


@pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed")
def test_all_installed_backends_are_offered(monkeypatch):
    monkeypatch.delenv("KILN_AGENT_BACKENDS", raising=False)
    assert {"onnxruntime", "openvino"} <= set(available_backends())


def test_tensorrt_is_designed_not_offered(monkeypatch):
    """TensorRT stays on paper (docs/tensorrt.md) until a GPU is reachable: no backend, even when asked for by name."""
    monkeypatch.setenv("KILN_AGENT_BACKENDS", "onnxruntime,tensorrt")
    assert "tensorrt" not in available_backends()
    with pytest.raises(BackendUnavailable, match="unknown backend 'tensorrt'"):
        get_backend("tensorrt")


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_fp16_model_with_float_io_keeps_its_declared_input_names(backend_name, tiny_model_path, tmp_path, sample_feeds):
    """OpenVINO fuses an FP16 model's input Cast into the parameter; the name must stay `input`."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    fp16 = convert_float_to_float16(onnx.load(str(tiny_model_path)), keep_io_types=True)
    path = tmp_path / "fp16.onnx"
    onnx.save(fp16, str(path))
    compiled = get_backend(backend_name).compile(path, tmp_path / "work")
    assert [spec.name for spec in compiled.input_specs] == [name for name in sample_feeds]
    outputs = compiled.run(sample_feeds)
    assert set(outputs) == {o.name for o in fp16.graph.output}


@pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed (pip install kiln[openvino])")
def test_openvino_profile_names_the_models_own_nodes_behind_each_runtime_node(tiny_model_path, sample_feeds, tmp_path):
    """OpenVINO renames and fuses nodes (`conv1/WithoutBiases` runs conv1 and relu1): the profile maps them back."""
    compiled = get_backend("openvino").compile(tiny_model_path, tmp_path / "ov", threads=1)
    try:
        profile = compiled.profile(sample_feeds, runs=2)
    finally:
        compiled.close()
    model_nodes = {node.name for node in onnx.load(str(tiny_model_path)).graph.node}
    mapped = [row for row in profile["by_node"] if row.get("layers")]
    assert mapped, profile["by_node"]
    for row in mapped:
        assert set(row["layers"]) <= model_nodes | {row["name"]}, (row, model_nodes)
    # A convolution fused with its activation lists both.
    assert any(len(row["layers"]) > 1 for row in mapped if row["op_type"] == "Convolution"), mapped


def test_made_up_runtime_names_and_suffixes_are_not_model_names():
    from devices.backends.base import model_layer_names

    assert model_layer_names(["conv1/WithoutBiases", "conv1", "relu1", "Multiply_615451", "fc/fq_weights_0", ""]) == ["conv1", "relu1", "fc"]
