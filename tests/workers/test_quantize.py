"""build_variant for every precision on the digits CNN and the transformer-like block."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.fixtures.models import build_loop_decoder, save_with_external_data, save_with_static_batch, write_npz
from tests.workers.helpers import run_model
from workers.inspect import model_size_bytes
from workers.quantize import (
    PRECISIONS,
    NotApplicable,
    NpzCalibrationReader,
    QuantizationError,
    build_variant,
    runnable_backends,
)
from workers.quantize.backends import load_check


def _ops(path) -> set[str]:
    return {node.op_type for node in onnx.load(str(path)).graph.node}


def test_precisions_are_the_documented_five():
    assert PRECISIONS == ("fp32", "fp16", "int8", "int8-dynamic", "int4-weight")


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8", "int8-dynamic"])
def test_digits_variant_builds_and_runs(digits, digits_path, digits_calibration, tmp_path, precision):
    out = tmp_path / f"digits-{precision}.onnx"
    result = build_variant(model_path=digits_path, precision=precision, out_path=out, calibration_path=digits_calibration)
    assert result["precision"] == precision
    assert "onnxruntime" in result["backends"]
    assert result["size_bytes"] == model_size_bytes(out) > 0
    (logits,) = run_model(out, {"input": digits.x_val})
    assert logits.dtype == np.float32 and logits.shape == (len(digits.x_val), 10)
    accuracy = float((logits.argmax(1) == digits.y_val).mean())
    assert accuracy >= digits.fp32_accuracy - 0.03


@pytest.mark.parametrize("precision", PRECISIONS)
def test_transformer_variant_builds_and_runs(transformer_path, transformer_calibration, transformer_inputs, tmp_path, precision):
    out = tmp_path / f"t-{precision}.onnx"
    result = build_variant(model_path=transformer_path, precision=precision, out_path=out, calibration_path=transformer_calibration)
    assert "onnxruntime" in result["backends"]
    feeds = {"input": transformer_inputs[:4]}
    (output,) = run_model(out, feeds)
    (reference,) = run_model(transformer_path, feeds)
    assert output.shape == reference.shape and output.dtype == np.float32
    cosine = float(np.dot(output.ravel(), reference.ravel()) / (np.linalg.norm(output) * np.linalg.norm(reference)))
    assert cosine > 0.98, f"{precision} output drifted too far (cosine {cosine:.4f})"


def test_fp32_is_an_exact_copy(digits_path, tmp_path):
    out = tmp_path / "fp32.onnx"
    result = build_variant(model_path=digits_path, precision="fp32", out_path=out)
    assert out.read_bytes() == digits_path.read_bytes()
    assert result["recipe"] == {"method": "copy"}


def test_fp32_of_an_external_data_model_does_not_share_its_data_file(transformer, tmp_path):
    src = save_with_external_data(transformer, tmp_path / "src")
    out = tmp_path / "variants" / "fp32.onnx"
    build_variant(model_path=src, precision="fp32", out_path=out)
    (tmp_path / "src" / "model.onnx.data").unlink()
    run_model(out, {"input": np.zeros((1, 16, 32), np.float32)})


def test_fp16_keeps_float32_io_and_stores_half_weights(digits_path, tmp_path):
    out = tmp_path / "fp16.onnx"
    result = build_variant(model_path=digits_path, precision="fp16", out_path=out)
    model = onnx.load(str(out))
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert model.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert {t.data_type for t in model.graph.initializer} == {TensorProto.FLOAT16}
    assert result["recipe"]["keep_io_types"] is True
    assert result["size_bytes"] < digits_path.stat().st_size * 0.7


def test_int8_keeps_top1_agreement_with_fp32(digits, digits_path, digits_calibration, tmp_path):
    out = tmp_path / "int8.onnx"
    result = build_variant(model_path=digits_path, precision="int8", out_path=out, calibration_path=digits_calibration)
    (quantized,) = run_model(out, {"input": digits.x_val})
    (reference,) = run_model(digits_path, {"input": digits.x_val})
    agreement = float((quantized.argmax(1) == reference.argmax(1)).mean())
    assert agreement >= 0.98
    recipe = result["recipe"]
    assert recipe["method"] == "static" and recipe["quant_format"] == "QDQ"
    assert recipe["per_channel"] is True and recipe["weight_symmetric"] is True
    assert recipe["calibration_method"] == "MinMax"
    assert recipe["samples"] == len(digits.x_calib)
    assert recipe["preprocess"] == "applied"
    assert {"QuantizeLinear", "DequantizeLinear"} <= _ops(out)


def test_int8_written_as_qoperator_runs_integer_operators_and_agrees_with_its_qdq_twin(digits, digits_path, digits_calibration, tmp_path):
    qdq, qop = tmp_path / "qdq.onnx", tmp_path / "qop.onnx"
    build_variant(model_path=digits_path, precision="int8", out_path=qdq, calibration_path=digits_calibration)
    result = build_variant(model_path=digits_path, precision="int8", out_path=qop, calibration_path=digits_calibration,
                           options={"quant_format": "qoperator"})
    assert result["recipe"]["quant_format"] == "QOperator" and "onnxruntime" in result["backends"]
    # The convolutions are integer operators, not float ones between QuantizeLinear/DequantizeLinear pairs.
    assert "QLinearConv" in _ops(qop) and "Conv" not in _ops(qop) and "Conv" in _ops(qdq)
    (from_qop,) = run_model(qop, {"input": digits.x_val})
    (from_qdq,) = run_model(qdq, {"input": digits.x_val})
    assert float((from_qop.argmax(1) == from_qdq.argmax(1)).mean()) >= 0.98


@pytest.mark.parametrize(("options", "error", "message"), [
    ({"quant_format": "qlinear"}, ValueError, "unknown quant_format 'qlinear'; choose qdq or qoperator"),
    ({"quant_format": "qoperator", "tool": "nncf"}, QuantizationError, "QOperator is built by ONNX Runtime's own quantizer"),
    ({"quant_format": "qoperator", "float_outputs": ["Gemm"]}, QuantizationError, "without learning or float outputs"),
])
def test_a_quant_format_that_cannot_be_built_is_refused_with_the_reason(digits_path, digits_calibration, tmp_path, options, error, message):
    with pytest.raises(error, match=message):
        build_variant(model_path=digits_path, precision="int8", out_path=tmp_path / "int8.onnx", calibration_path=digits_calibration,
                      options=options)
    assert not (tmp_path / "int8.onnx").exists()


def test_per_channel_int8_of_an_old_opset_model_loads_and_agrees(digits, digits_path, digits_calibration, tmp_path):
    # ddddocr's models are at opsets 11 and 12: a per-channel DequantizeLinear (its `axis`) needs opset 13.
    old = onnx.load(str(digits_path))
    del old.opset_import[:]
    old.opset_import.append(helper.make_opsetid("", 11))
    onnx.checker.check_model(old)
    old_path = tmp_path / "opset11.onnx"
    onnx.save(old, str(old_path))
    out = tmp_path / "int8.onnx"
    result = build_variant(model_path=old_path, precision="int8", out_path=out, calibration_path=digits_calibration,
                           options={"per_channel": True})
    assert "onnxruntime" in result["backends"]
    assert max(o.version for o in onnx.load(str(out)).opset_import if o.domain in ("", "ai.onnx")) >= 13
    (quantized,) = run_model(out, {"input": digits.x_val})
    (reference,) = run_model(digits_path, {"input": digits.x_val})
    assert float((quantized.argmax(1) == reference.argmax(1)).mean()) >= 0.98


def test_int8_options_are_honoured(digits_path, digits_calibration, tmp_path):
    out = tmp_path / "int8.onnx"
    result = build_variant(
        model_path=digits_path, precision="int8", out_path=out, calibration_path=digits_calibration,
        options={"max_calibration_samples": 20, "calibration_method": "percentile", "nodes_to_exclude": ["fc"], "skip_preprocess": True},
    )
    recipe = result["recipe"]
    assert recipe["samples"] == 20 and recipe["calibration_method"] == "Percentile"
    assert recipe["nodes_excluded"] == ["fc"] and recipe["preprocess"].startswith("skipped")
    gemm = [n for n in onnx.load(str(out)).graph.node if n.op_type == "Gemm"]
    assert gemm and gemm[0].input[1] == "fc.weight"


def test_int8_preprocess_failure_is_recorded_not_fatal(digits_path, digits_calibration, tmp_path, monkeypatch):
    import onnxruntime.quantization.shape_inference as ort_shape_inference

    def broken(*args, **kwargs):
        raise RuntimeError("preprocess broke")

    monkeypatch.setattr(ort_shape_inference, "quant_pre_process", broken)
    result = build_variant(model_path=digits_path, precision="int8", out_path=tmp_path / "q.onnx", calibration_path=digits_calibration)
    assert result["recipe"]["preprocess"] == "skipped: RuntimeError: preprocess broke"


def test_int8_needs_enough_calibration_samples(digits, digits_path, tmp_path):
    small = write_npz(tmp_path / "small.npz", input=digits.x_calib[:5])
    with pytest.raises(QuantizationError, match="5 samples; int8 needs at least 8"):
        build_variant(model_path=digits_path, precision="int8", out_path=tmp_path / "q.onnx", calibration_path=small)
    with pytest.raises(QuantizationError, match="needs a calibration dataset"):
        build_variant(model_path=digits_path, precision="int8", out_path=tmp_path / "q.onnx")


def test_int8_calibration_set_must_have_the_model_input(digits_path, tmp_path):
    wrong = write_npz(tmp_path / "wrong.npz", pixels=np.zeros((16, 1, 8, 8), np.float32))
    with pytest.raises(QuantizationError, match="'input'"):
        build_variant(model_path=digits_path, precision="int8", out_path=tmp_path / "q.onnx", calibration_path=wrong)


def test_int8_dynamic_quantizes_at_run_time(digits_path, tmp_path):
    out = tmp_path / "dyn.onnx"
    result = build_variant(model_path=digits_path, precision="int8-dynamic", out_path=out)
    assert "DynamicQuantizeLinear" in _ops(out)
    assert result["recipe"]["method"] == "dynamic"


def test_int4_weight_replaces_matmuls(transformer_path, tmp_path):
    out = tmp_path / "int4.onnx"
    result = build_variant(model_path=transformer_path, precision="int4-weight", out_path=out)
    ops = _ops(out)
    assert "MatMulNBits" in ops
    assert result["recipe"]["block_size"] == 32 and result["recipe"]["bits"] == 4
    # Q, K, V, attention output, FFN in and out: the six weight MatMuls; the two activation MatMuls stay.
    assert result["recipe"]["quantized_nodes"] == 6
    assert result["size_bytes"] < transformer_path.stat().st_size / 3


def test_int4_weight_is_not_applicable_without_matmul_weights(digits_path, tmp_path):
    with pytest.raises(NotApplicable, match="int4-weight needs MatMul weights; this model has none"):
        build_variant(model_path=digits_path, precision="int4-weight", out_path=tmp_path / "q.onnx")
    assert not (tmp_path / "q.onnx").exists()


def test_unknown_precision_and_options_are_refused(digits_path, tmp_path):
    with pytest.raises(ValueError, match="unknown precision"):
        build_variant(model_path=digits_path, precision="int2", out_path=tmp_path / "q.onnx")
    with pytest.raises(ValueError, match="per_chanel"):
        build_variant(model_path=digits_path, precision="int8-dynamic", out_path=tmp_path / "q.onnx", options={"per_chanel": True})


def test_calibration_reader_streams_and_counts(digits, digits_calibration):
    reader = NpzCalibrationReader(digits_calibration, input_names=["input"], batch_size=50)
    batches = list(iter(reader.get_next, None))
    assert [len(b["input"]) for b in batches] == [50, 50, len(digits.x_calib) - 100]
    assert reader.samples_read == len(digits.x_calib)
    reader.rewind()
    assert reader.samples_read == 0 and len(reader.get_next()["input"]) == 50


def test_runnable_backends_reports_nothing_for_an_unknown_op(tmp_path):
    node = helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    path = tmp_path / "custom.onnx"
    onnx.save(model, str(path))
    assert runnable_backends(path) == []


def test_runnable_backends_lists_both_for_a_plain_model(digits_path):
    pytest.importorskip("openvino")
    assert runnable_backends(digits_path) == ["onnxruntime", "openvino"]
    assert load_check(digits_path) == (["onnxruntime", "openvino"], {})


def test_a_runtime_that_refuses_a_built_variant_is_named_with_its_reason_and_costs_only_itself(tmp_path):
    pytest.importorskip("openvino")
    onnx.save(build_loop_decoder(), str(tmp_path / "decoder.onnx"))
    built = build_variant(model_path=tmp_path / "decoder.onnx", precision="fp32", out_path=tmp_path / "fp32.onnx")
    assert built["backends"] == ["onnxruntime"] and set(built["refused_backends"]) == {"openvino"}
    # OpenVINO's own words, as the agent's support check tells them, naming the Loop its reader refused.
    assert built["refused_backends"]["openvino"].startswith("OpenVINO 2026.4") and "cannot read the model (inside Loop 'decoder')" in built["refused_backends"]["openvino"]


def test_int8_on_a_static_batch_model_calibrates_on_whole_batches(digits, digits_calibration, tmp_path):
    path = save_with_static_batch(digits.model, tmp_path / "b5.onnx", 5)
    result = build_variant(model_path=path, precision="int8", out_path=tmp_path / "q.onnx", calibration_path=digits_calibration)
    assert result["recipe"]["samples"] == len(digits.x_calib) // 5 * 5


def test_failed_build_leaves_no_artifact(digits_path, tmp_path, monkeypatch):
    from workers.quantize import variants

    monkeypatch.setattr(variants, "load_check", lambda path: ([], {}))
    out = tmp_path / "fp16.onnx"
    with pytest.raises(QuantizationError, match="no runtime"):
        build_variant(model_path=digits_path, precision="fp16", out_path=out)
    assert not out.exists()
