"""INT4 weight-only mixes, Gemm → MatMul, NNCF's ONNX backend, and ISA schemes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.workers.helpers import run_model
from workers.quantize import build_variant
from workers.quantize.mixed import gemm_to_matmul
from workers.quantize.schemes import ort_int8_scheme
from workers.quantize.sensitivity import rank_int4_weights, rank_nodes


def _sqnr(output, reference):
    return 10 * np.log10(np.sum(reference.astype(np.float64) ** 2) / np.sum((reference - output).astype(np.float64) ** 2))


def _accuracy(path, data):
    (logits,) = run_model(path, {"input": data.x_val})
    return float((logits.argmax(1) == data.y_val).mean()), logits


def test_int4_int8_mix_on_the_digits_mlp_loses_less_than_plain_int4(mlp, mlp_files, tmp_path):
    most_sensitive = rank_int4_weights(rank_nodes(model_path=mlp_files.model, calibration_path=mlp_files.calibration))[0]
    plain = build_variant(model_path=mlp_files.model, precision="int4-weight", out_path=tmp_path / "int4.onnx")
    mixed = build_variant(model_path=mlp_files.model, precision="int4-weight", out_path=tmp_path / "mix.onnx",
                          options={"int8_nodes": [most_sensitive]})
    assert plain["recipe"]["quantized_nodes"] == mixed["recipe"]["quantized_nodes"] == 3
    assert mixed["recipe"]["int8_nodes"] == [most_sensitive] and mixed["recipe"]["int8_quantized_nodes"] == 1
    (reference,) = run_model(mlp_files.model, {"input": mlp.x_val})
    plain_accuracy, plain_logits = _accuracy(tmp_path / "int4.onnx", mlp)
    mixed_accuracy, mixed_logits = _accuracy(tmp_path / "mix.onnx", mlp)
    assert _sqnr(mixed_logits, reference) > _sqnr(plain_logits, reference) + 1.0
    assert mlp.fp32_accuracy - mixed_accuracy <= min(0.01, mlp.fp32_accuracy - plain_accuracy + 1e-9)


def test_int4_on_the_digits_cnn_quantizes_its_gemm_after_conversion(digits, digits_path, tmp_path):
    converted, names = gemm_to_matmul(digits.model)
    assert names == ["fc"]
    assert {node.op_type for node in converted.graph.node} >= {"MatMul", "Add"}
    onnx.save(converted, str(tmp_path / "mm.onnx"))
    np.testing.assert_allclose(run_model(tmp_path / "mm.onnx", {"input": digits.x_val})[0],
                               run_model(digits_path, {"input": digits.x_val})[0], atol=1e-5)
    result = build_variant(model_path=digits_path, precision="int4-weight", out_path=tmp_path / "int4.onnx",
                           options={"gemm_to_matmul": True, "int8_nodes": ["fc"]})
    assert result["recipe"]["gemm_to_matmul"] == ["fc"] and result["recipe"]["int8_quantized_nodes"] == 1
    accuracy, _ = _accuracy(tmp_path / "int4.onnx", digits)
    assert accuracy >= digits.fp32_accuracy - 0.01


def test_nncf_int8_on_onnx_gives_a_qdq_model_with_ignored_scope(digits, digits_path, digits_calibration, tmp_path):
    out = tmp_path / "nncf.onnx"
    result = build_variant(model_path=digits_path, precision="int8", out_path=out, calibration_path=digits_calibration,
                           options={"tool": "nncf", "nodes_to_exclude": ["fc"], "preset": "mixed"})
    assert result["recipe"]["tool"].startswith("nncf") and result["recipe"]["preset"] == "mixed"
    model = onnx.load(str(out))
    assert any(node.op_type == "QuantizeLinear" for node in model.graph.node)
    gemm = next(node for node in model.graph.node if node.op_type == "Gemm")
    producers = {output: node.op_type for node in model.graph.node for output in node.output}
    assert producers.get(gemm.input[1]) != "DequantizeLinear"  # fc kept in float
    assert set(result["backends"]) == {"onnxruntime", "openvino"}
    accuracy, _ = _accuracy(out, digits)
    assert accuracy >= digits.fp32_accuracy - 0.02


def test_nncf_int4_with_a_ratio_keeps_part_of_the_weights_in_int8(mlp_files, tmp_path):
    result = build_variant(model_path=mlp_files.model, precision="int4-weight", out_path=tmp_path / "nncf4.onnx",
                           calibration_path=mlp_files.calibration, options={"tool": "nncf", "ratio": 0.5})
    assert result["recipe"]["ratio"] == 0.5
    ops = [node.op_type for node in onnx.load(str(tmp_path / "nncf4.onnx")).graph.node]
    assert "MatMulNBits" in ops and "DequantizeLinear" in ops


@pytest.mark.parametrize("isa, name", [
    (["avx2", "avx512f", "avx512_vnni"], "U8S8"),
    (["avx2", "fma"], "U8S8-reduce-range"),
    (["sse4_2"], "U8U8"),
    (["asimd", "asimddp"], "S8S8"),
])
def test_ort_scheme_follows_isa_flags(isa, name):
    assert ort_int8_scheme(isa)["name"] == name
