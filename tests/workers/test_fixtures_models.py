"""The shared model fixtures are what the other tests rely on; pin their promises."""

from __future__ import annotations

import zipfile

import numpy as np
import onnx
import pytest

from tests.fixtures.models import (
    build_transformer_like,
    make_model_zip,
    train_digits_cnn,
    write_npz,
)
from tests.workers.helpers import run_model


def test_digits_cnn_is_accurate_and_has_the_documented_signature(digits):
    assert digits.fp32_accuracy >= 0.95
    graph = digits.model.graph
    assert [i.name for i in graph.input] == ["input"]
    dims = [d.dim_param or d.dim_value for d in graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", 1, 8, 8]
    assert [o.name for o in graph.output] == ["logits"]
    assert digits.model.opset_import[0].version == 17
    assert digits.x_calib.shape[1:] == (1, 8, 8) and digits.x_val.shape[0] == digits.y_val.shape[0]


def test_digits_cnn_is_cached_per_arguments(digits):
    assert train_digits_cnn() is digits


def test_digits_accuracy_is_what_the_onnx_graph_scores(digits, tmp_path):
    path = tmp_path / "d.onnx"
    onnx.save(digits.model, str(path))
    (logits,) = run_model(path, {"input": digits.x_val})
    assert float((logits.argmax(1) == digits.y_val).mean()) == digits.fp32_accuracy


def test_transformer_like_is_deterministic_and_runs(transformer, tmp_path):
    again = build_transformer_like()
    assert again.SerializeToString() == transformer.SerializeToString()
    path = tmp_path / "t.onnx"
    onnx.save(transformer, str(path))
    x = np.ones((3, 16, 32), np.float32)
    (out,) = run_model(path, {"input": x})
    assert out.shape == (3, 16, 32) and np.isfinite(out).all()
    ops = {node.op_type for node in transformer.graph.node}
    assert {"MatMul", "Softmax", "LayerNormalization", "Erf"} <= ops


def test_make_model_zip_holds_model_and_external_data(transformer, tmp_path):
    path = make_model_zip(transformer, tmp_path / "m.zip")
    with zipfile.ZipFile(path) as archive:
        assert sorted(archive.namelist()) == ["model.onnx", "model.onnx.data"]
    # The caller's proto must keep its weights in memory.
    assert all(t.HasField("raw_data") for t in transformer.graph.initializer)


def test_write_npz_writes_exactly_the_given_path(tmp_path):
    path = write_npz(tmp_path / "data.bin", a=np.arange(3))
    assert path.exists() and not (tmp_path / "data.bin.npz").exists()
    assert np.load(path)["a"].tolist() == [0, 1, 2]


def test_cached_digits_arrays_are_read_only(digits):
    with pytest.raises(ValueError, match="read-only"):
        digits.x_val[0, 0, 0, 0] = 1.0
