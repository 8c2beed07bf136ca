"""Per-node sensitivity: a layer made deliberately sensitive ranks first; INT4 scores exist only for MatMul weights."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.fixtures.models import write_npz
from workers.quantize.sensitivity import (
    fake_quantize_blockwise,
    fake_quantize_per_channel,
    rank_nodes,
)


def _two_layer_graph(path, *, sensitive: str):
    """x → MatMul a → Relu → (× [1000, 1, …]) → MatMul b; the outlier channel feeds `sensitive`'s input."""
    rng = np.random.default_rng(0)
    width = 16
    outliers = np.ones(width, np.float32)
    outliers[0] = 1000.0
    weight_a = rng.standard_normal((width, width)).astype(np.float32) / 4
    weight_b = rng.standard_normal((width, width)).astype(np.float32) / 4
    # Keep the output balanced: the outlier channel's weights are tiny, the signal lives elsewhere.
    weight_b[0] *= 1e-3
    nodes = [
        helper.make_node("MatMul", ["x", "wa"], ["a"], name="a"),
        helper.make_node("Relu", ["a"], ["ra"], name="relu"),
        helper.make_node("Mul", ["ra", "outliers"], ["spiky"], name="spike"),
        helper.make_node("MatMul", ["spiky", "wb"], ["y"], name="b"),
    ]
    if sensitive == "a":
        # Move the outliers in front of the first layer instead.
        nodes = [
            helper.make_node("Mul", ["x", "outliers"], ["spiky"], name="spike"),
            helper.make_node("MatMul", ["spiky", "wa_small"], ["a"], name="a"),
            helper.make_node("Relu", ["a"], ["ra"], name="relu"),
            helper.make_node("MatMul", ["ra", "wb_plain"], ["y"], name="b"),
        ]
    weight_a_small = weight_a.copy()
    weight_a_small[0] *= 1e-3
    initializers = [numpy_helper.from_array(v, n) for n, v in {
        "wa": weight_a, "wb": weight_b, "outliers": outliers, "wa_small": weight_a_small,
        "wb_plain": rng.standard_normal((width, width)).astype(np.float32) / 4}.items()]
    used = {name for node in nodes for name in node.input}
    graph = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", width])],
                              [t for t in initializers if t.name in used])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("sensitive", ["a", "b"])
def test_layer_whose_input_has_huge_outliers_ranks_first(tmp_path, sensitive):
    model = _two_layer_graph(tmp_path / "m.onnx", sensitive=sensitive)
    calibration = write_npz(tmp_path / "c.npz", x=np.random.default_rng(1).standard_normal((64, 16)).astype(np.float32))
    ranking = rank_nodes(model_path=model, calibration_path=calibration, max_samples=32)
    assert ranking[0]["node"] == sensitive
    first, second = ranking
    assert first["sqnr_db"] < 20.0
    assert second["sqnr_db"] > 30.0
    assert first["relative_error"] > 10 * second["relative_error"]
    assert [row["rank"] for row in ranking] == [0, 1]
    assert {"node", "op_type", "sqnr_db", "relative_error"} <= set(first)


def test_digits_cnn_ranking_covers_every_compute_node(digits_path, digits_calibration):
    ranking = rank_nodes(model_path=digits_path, calibration_path=digits_calibration, max_samples=32)
    assert sorted(row["node"] for row in ranking) == ["conv1", "conv2", "fc"]
    assert [row["sqnr_db"] for row in ranking] == sorted(row["sqnr_db"] for row in ranking)
    # INT4 weight-only scores belong to MatMuls with constant weights only.
    assert all("int4_sqnr_db" not in row for row in ranking)


def test_transformer_ranking_scores_int4_for_weight_matmuls_only(transformer_path, transformer_calibration):
    ranking = rank_nodes(model_path=transformer_path, calibration_path=transformer_calibration, max_samples=16)
    by_node = {row["node"]: row for row in ranking}
    assert "int4_sqnr_db" in by_node["layer0.query.matmul"]
    assert "int4_sqnr_db" not in by_node["layer0.scores"]  # activation × activation
    assert all(row["int4_sqnr_db"] < row["sqnr_db"] for row in ranking if "int4_sqnr_db" in row)


def test_fake_quantizers_match_their_integer_grids():
    weight = np.array([[0.5, -2.0], [0.25, 1.0], [-1.0, 0.1]], np.float32)
    per_channel = fake_quantize_per_channel(weight, axis=1)
    np.testing.assert_allclose(per_channel[:, 1] / (2.0 / 127), np.round(per_channel[:, 1] / (2.0 / 127)), atol=1e-4)
    assert per_channel[1, 1] == pytest.approx(1.0, abs=2.0 / 127)
    blockwise = fake_quantize_blockwise(weight, block_size=16)
    # Column 0: absmax 1.0 → scale 1/8, so 0.25 and 0.5 are exact and -1.0 is exact.
    np.testing.assert_allclose(blockwise[:, 0], weight[:, 0])
