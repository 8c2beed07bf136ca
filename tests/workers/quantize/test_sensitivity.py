"""Per-node sensitivity: a layer made deliberately sensitive ranks first; INT4 scores exist only for MatMul weights."""

from __future__ import annotations

import json

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


# A model whose tapped activations are about 75 MB a sample (31 1x1 convolutions on 16 x 192 x 192, then a MatMul of
# two activations), against a 640 MB build budget: a batch of 8 samples' tensors at once (600 MB) does not fit it.
WIDE = {"channels": 16, "side": 192, "depth": 31}
BUDGET_MB = 640


def _wide_chain(*, channels: int, side: int, depth: int) -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["t0"])]
    initializers = [numpy_helper.from_array((rng.standard_normal((channels, 3, 1, 1)) * 0.5).astype(np.float32), "w0")]
    for index in range(1, depth):
        weight = f"w{index}"
        initializers.append(numpy_helper.from_array((rng.standard_normal((channels, channels, 1, 1)) * 0.3).astype(np.float32), weight))
        nodes += [helper.make_node("Relu", [f"t{index - 1}"], [f"r{index}"]),
                  helper.make_node("Conv", [f"r{index}", weight], [f"t{index}"])]
    # A node with two activation inputs: its probe needs both in the same streamed group.
    nodes.append(helper.make_node("MatMul", [f"t{depth - 1}", f"t{depth - 2}"], ["y"]))
    graph = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, side, side])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", channels, side, side])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_sensitivity_of_large_activations_fits_the_build_budget_with_the_same_ranking(tmp_path, monkeypatch):
    from tests.fixtures.budget import run_under_budget
    from workers.quantize import streaming

    model = tmp_path / "wide.onnx"
    onnx.save(_wide_chain(**WIDE), str(model))
    samples = np.random.default_rng(4).standard_normal((8, 3, WIDE["side"], WIDE["side"])).astype(np.float32)
    calibration = write_npz(tmp_path / "calibration.npz", x=samples)

    streamed = f"""
        import json, sys
        from workers.quantize.sensitivity import rank_nodes
        json.dump(rank_nodes(model_path={str(model)!r}, calibration_path={str(calibration)!r}, batch_size=8), open(sys.argv[1], "w"))
    """
    stopped, peak_mb, result = run_under_budget(streamed, BUDGET_MB, tmp_path)
    assert not stopped and peak_mb < BUDGET_MB
    ranked = {row["node"]: row for row in json.loads(result.read_text())}
    assert len(ranked) == WIDE["depth"] + 1 and all(np.isfinite(row["sqnr_db"]) for row in ranked.values())

    # The same scores as one pass with every tensor of every sample at once (memory no object, in this process).
    monkeypatch.setattr(streaming, "memory_allowance_bytes", lambda budget_mb=None: 1 << 40)
    whole = {row["node"]: row for row in rank_nodes(model_path=model, calibration_path=calibration, batch_size=8)}
    assert list(ranked) == list(whole)
    for name, row in whole.items():
        assert ranked[name]["sqnr_db"] == pytest.approx(row["sqnr_db"], rel=1e-6), name


def _two_lstm_graph(path, *, sensitive: str):
    """x → LSTM a → Squeeze → LSTM b (only Y_h named); the input of `sensitive` carries a channel 1000x the others, whose
    weights are tiny, so per-tensor INT8 of that input drowns the channels that carry the signal."""
    rng = np.random.default_rng(1)
    steps, width, hidden = 6, 8, 8
    outliers = np.ones(width, np.float32)
    outliers[0] = 1000.0

    def weights(prefix, inputs, spiky):
        w = rng.standard_normal((1, 4 * hidden, inputs)).astype(np.float32) / 2
        if spiky:
            w[:, :, 0] *= 1e-3
        r = rng.standard_normal((1, 4 * hidden, hidden)).astype(np.float32) / 4
        return [numpy_helper.from_array(w, f"{prefix}_w"), numpy_helper.from_array(r, f"{prefix}_r")]

    nodes = [
        # Batch first, as a user's data comes; the LSTM reads [steps, batch, width].
        helper.make_node("Transpose", ["x"], ["x_raw"], name="time_major", perm=[1, 0, 2]),
        helper.make_node("Mul", ["x_raw", "outliers"], ["spiky_x"], name="spike_x"),
        helper.make_node("LSTM", ["spiky_x" if sensitive == "a" else "x_raw", "a_w", "a_r"], ["ya"], name="a", hidden_size=hidden),
        helper.make_node("Squeeze", ["ya", "axis1"], ["ha"], name="squeeze"),
        helper.make_node("Mul", ["ha", "outliers"], ["spiky_h"], name="spike_h"),
        helper.make_node("LSTM", ["spiky_h" if sensitive == "b" else "ha", "b_w", "b_r"], ["", "y"], name="b", hidden_size=hidden),
    ]
    initializers = [*weights("a", width, sensitive == "a"), *weights("b", hidden, sensitive == "b"),
                    numpy_helper.from_array(outliers, "outliers"), numpy_helper.from_array(np.array([1], np.int64), "axis1")]
    graph = helper.make_graph(nodes, "lstms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", steps, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n", hidden])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("sensitive", ["a", "b"])
def test_an_lstm_whose_input_has_huge_outliers_ranks_first_and_one_with_only_y_h_named_is_ranked_too(tmp_path, sensitive):
    model = _two_lstm_graph(tmp_path / "lstms.onnx", sensitive=sensitive)
    calibration = write_npz(tmp_path / "cal.npz", x=np.random.default_rng(2).standard_normal((16, 6, 8)).astype(np.float32))
    rows = rank_nodes(model_path=model, calibration_path=calibration, max_samples=16)
    assert {row["node"]: row["op_type"] for row in rows} == {"a": "LSTM", "b": "LSTM"}
    assert rows[0]["node"] == sensitive and rows[0]["sqnr_db"] < rows[1]["sqnr_db"] - 10
    assert all("int4_sqnr_db" not in row for row in rows)
