"""convert_model: every step on real models, skipped steps with reasons, check fallback, large models."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.fixtures.models import save_with_external_data
from tests.workers.helpers import run_model
from workers import convert
from workers.convert import convert_model
from workers.inspect import inspect_onnx

STEP_NAMES = ["opset_upgrade", "shape_inference", "simplify", "check"]


def _steps(result):
    return {step["name"]: step for step in result["steps"]}


def test_digits_converts_and_computes_the_same(digits, digits_path, tmp_path):
    dst = tmp_path / "out" / "digits.onnx"
    result = convert_model(digits_path, dst)
    assert [step["name"] for step in result["steps"]] == STEP_NAMES
    steps = _steps(result)
    assert steps["opset_upgrade"]["status"] == "skipped" and "already at opset 17" in steps["opset_upgrade"]["reason"]
    assert steps["shape_inference"]["status"] == "applied"
    assert steps["simplify"]["status"] == "applied"
    assert steps["check"] == {**steps["check"], "status": "applied", "reason": None}
    assert all(step["seconds"] >= 0 for step in result["steps"])
    assert result["opset"] == 17
    onnx.checker.check_model(str(dst))
    np.testing.assert_allclose(run_model(dst, {"input": digits.x_val})[0], run_model(digits_path, {"input": digits.x_val})[0], atol=1e-5)
    assert inspect_onnx(dst)["signature"] == inspect_onnx(digits_path)["signature"]
    # The scratch folder is gone.
    assert sorted(p.name for p in dst.parent.iterdir()) == ["digits.onnx"]


def test_transformer_converts_and_computes_the_same(transformer_path, transformer_inputs, tmp_path):
    dst = tmp_path / "t.onnx"
    result = convert_model(transformer_path, dst)
    assert _steps(result)["simplify"]["status"] == "applied"
    feeds = {"input": transformer_inputs[:4]}
    np.testing.assert_allclose(run_model(dst, feeds)[0], run_model(transformer_path, feeds)[0], atol=1e-4)
    assert inspect_onnx(dst)["signature"] == inspect_onnx(transformer_path)["signature"]


def test_old_opset_with_external_data_is_upgraded(digits, tmp_path):
    old = onnx.ModelProto()
    old.CopyFrom(digits.model)
    old.opset_import[0].version = 11
    src = save_with_external_data(old, tmp_path / "src")
    dst = tmp_path / "out" / "digits.onnx"
    result = convert_model(src, dst, target_opset=17)
    assert _steps(result)["opset_upgrade"]["status"] == "applied"
    assert result["opset"] == 17
    # Small result: one self-contained file, readable without the source folder.
    assert sorted(p.name for p in dst.parent.iterdir()) == ["digits.onnx"]
    np.testing.assert_allclose(run_model(dst, {"input": digits.x_val})[0], run_model(src, {"input": digits.x_val})[0], atol=1e-5)


def test_simplify_failure_is_skipped_with_reason(digits, digits_path, tmp_path, monkeypatch):
    import onnxslim

    def broken_slim(*args, **kwargs):
        raise RuntimeError("slim exploded")

    monkeypatch.setattr(onnxslim, "slim", broken_slim)
    dst = tmp_path / "d.onnx"
    result = convert_model(digits_path, dst)
    simplify = _steps(result)["simplify"]
    assert simplify["status"] == "skipped"
    assert "slim exploded" in simplify["reason"] and "RuntimeError" in simplify["reason"]
    assert _steps(result)["check"]["status"] == "applied"
    np.testing.assert_allclose(run_model(dst, {"input": digits.x_val})[0], run_model(digits_path, {"input": digits.x_val})[0], atol=1e-5)


def test_shape_inference_failure_is_skipped_with_reason(digits_path, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise onnx.shape_inference.InferenceError("inference says no")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes_path", broken)
    result = convert_model(digits_path, tmp_path / "d.onnx")
    step = _steps(result)["shape_inference"]
    assert step["status"] == "skipped" and "inference says no" in step["reason"]


def test_failed_check_falls_back_to_last_good_model(digits, digits_path, tmp_path, monkeypatch):
    def simplify_into_garbage(source, output, *, target_opset):
        model = onnx.load(str(source))
        # A node reading a tensor nobody produces: the checker must reject this.
        model.graph.node.append(helper.make_node("Relu", ["no_such_tensor"], ["dangling"]))
        onnx.save(model, str(output))

    monkeypatch.setattr(convert, "_simplify", simplify_into_garbage)
    dst = tmp_path / "d.onnx"
    result = convert_model(digits_path, dst)
    steps = _steps(result)
    assert steps["simplify"]["status"] == "applied"
    assert steps["check"]["status"] == "failed"
    assert "shape_inference" in steps["check"]["reason"]
    onnx.checker.check_model(str(dst))
    assert "dangling" not in {out for node in onnx.load(str(dst)).graph.node for out in node.output}
    np.testing.assert_allclose(run_model(dst, {"input": digits.x_val})[0], run_model(digits_path, {"input": digits.x_val})[0], atol=1e-5)


def test_large_model_is_written_with_external_data(transformer_path, transformer_inputs, tmp_path, monkeypatch):
    # Pretend the threshold is tiny rather than building a 1.5 GB model in a unit test.
    monkeypatch.setattr(convert, "LARGE_MODEL_BYTES", 10_000)
    dst = tmp_path / "t.onnx"
    convert_model(transformer_path, dst)
    assert (tmp_path / "t.onnx.data").is_file()
    assert dst.stat().st_size < transformer_path.stat().st_size
    feeds = {"input": transformer_inputs[:2]}
    np.testing.assert_allclose(run_model(dst, feeds)[0], run_model(transformer_path, feeds)[0], atol=1e-4)


def test_unreadable_source_raises(tmp_path):
    src = tmp_path / "bad.onnx"
    src.write_bytes(b"\x00\xff" * 10)
    with pytest.raises(ValueError):
        convert_model(src, tmp_path / "out.onnx")


def test_simplification_that_changes_outputs_is_rejected(digits, digits_path, tmp_path, monkeypatch):
    import onnxslim

    def wrong_slim(model, *args, **kwargs):
        # A "simplification" that silently scales the classifier weights.
        for tensor in model.graph.initializer:
            if tensor.name == "fc.weight":
                tensor.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(tensor) * 2, "fc.weight"))
        return model

    monkeypatch.setattr(onnxslim, "slim", wrong_slim)
    dst = tmp_path / "d.onnx"
    result = convert_model(digits_path, dst)
    simplify = _steps(result)["simplify"]
    assert simplify["status"] == "skipped" and "changed the model's outputs" in simplify["reason"]
    np.testing.assert_allclose(run_model(dst, {"input": digits.x_val})[0], run_model(digits_path, {"input": digits.x_val})[0], atol=1e-5)
