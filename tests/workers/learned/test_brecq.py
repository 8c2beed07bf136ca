"""Block reconstruction (BRECQ): layers that form a chain are learned together against the chain's output, which beats
learning each layer's rounding on its own where the layers' errors can cancel one another; the result is the calibrated
QDQ graph with learned integers, run by ONNX Runtime like any INT8 variant."""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.fixtures.models import write_npz
from tests.fixtures.rounding import block_inputs, build_block_sensitive_mlp
from tests.workers.helpers import run_on_device_backend
from workers.learned import recipes
from workers.learned.brecq import find_blocks
from workers.learned.layers import find_layers, quantized_activations, quantized_initializers
from workers.quantize import build_variant

pytestmark = pytest.mark.timeout(300)
CALIBRATED = {"calibration_method": "mse", "per_channel": True}
# Learning is bounded by steps here, not by the (generous) time budget, so that both methods learn as long on a busy machine.
STEPS_PER_LAYER = 500


def relative_error(values: np.ndarray, reference: np.ndarray) -> float:
    return float(np.mean((values - reference) ** 2) / np.mean(reference ** 2))


def test_block_reconstruction_beats_per_layer_rounding_where_the_layers_errors_can_cancel(tmp_path, monkeypatch):
    monkeypatch.setattr(recipes, "MAX_STEPS_PER_LAYER", STEPS_PER_LAYER)
    model = tmp_path / "model.onnx"
    onnx.save(build_block_sensitive_mlp(), model)
    calibration = write_npz(tmp_path / "calibration.npz", input=block_inputs(samples=256, seed=1))
    held_out = block_inputs(samples=256, seed=2)
    reference = run_on_device_backend(model, held_out)
    calibrated = tmp_path / "calibrated.onnx"
    build_variant(model_path=model, precision="int8", out_path=calibrated, calibration_path=calibration, options=CALIBRATED)
    errors, recipes_built = {"calibrated": relative_error(run_on_device_backend(calibrated, held_out), reference)}, {}
    for method in ("adaround", "brecq"):
        out = tmp_path / f"{method}.onnx"
        built = build_variant(model_path=model, precision="int8", out_path=out, calibration_path=calibration,
                              options={**CALIBRATED, "learn": method, "learn_seconds": 600})
        recipes_built[method] = built["recipe"]["learned"]
        errors[method] = relative_error(run_on_device_backend(out, held_out), reference)
        # Only the integer weights changed: the calibrated graph's operators, so its speed.
        assert Counter(n.op_type for n in onnx.load(str(out)).graph.node) == Counter(n.op_type for n in onnx.load(str(calibrated)).graph.node)
    assert errors["brecq"] < 0.9 * errors["adaround"] < errors["calibrated"], errors
    block = recipes_built["brecq"]["layers"]
    # Both layers in one block, learned against the block's output with a learning curve like AdaRound's.
    assert recipes_built["brecq"]["blocks"] == 1 and len(block) == 1 and len(block[0]["block"]) == 2, block
    assert block[0]["steps"] == 2 * STEPS_PER_LAYER and block[0]["mse_learned"] < block[0]["mse_nearest"]
    assert 10 <= len(recipes_built["brecq"]["curve"]) <= 60 and recipes_built["brecq"]["kept"] == "learned"


def chain_with_a_branch() -> onnx.ModelProto:
    """a -> Relu -> b -> c, whose output is both a graph output and d's input: a branch point after c."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["input", "w_a"], ["a_out"], name="a"), helper.make_node("Relu", ["a_out"], ["a_relu"], name="relu"),
             helper.make_node("MatMul", ["a_relu", "w_b"], ["b_out"], name="b"), helper.make_node("MatMul", ["b_out", "w_c"], ["c_out"], name="c"),
             helper.make_node("MatMul", ["c_out", "w_d"], ["d_out"], name="d")]
    weights = [numpy_helper.from_array((rng.standard_normal((8, 8)) / 3).astype(np.float32), f"w_{name}") for name in "abcd"]
    graph = helper.make_graph(nodes, "branch", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 8]) for name in ("c_out", "d_out")], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_blocks_are_chains_between_branch_points_of_at_most_the_given_length(tmp_path):
    model = tmp_path / "branch.onnx"
    onnx.save(chain_with_a_branch(), model)
    calibration = write_npz(tmp_path / "calibration.npz", input=np.random.default_rng(1).standard_normal((32, 8)).astype(np.float32))
    quantized = tmp_path / "quantized.onnx"
    build_variant(model_path=model, precision="int8", out_path=quantized, calibration_path=calibration,
                  options={"calibration_method": "minmax", "per_channel": True, "skip_preprocess": True})
    qdq, fp32 = onnx.load(str(quantized)), onnx.load(str(model))
    layers = [layer for layer in find_layers(qdq, fp32) if layer.skipped is None]
    tensors = {"activations": quantized_activations(qdq, fp32), "fixed": quantized_initializers(qdq, fp32)}

    def grouped(**limit):
        return [[layer.weight_name for layer in block.layers] for block in find_blocks(fp32, layers, **tensors, **limit)]

    # c's output leaves the chain (a graph output), so d starts a block of its own.
    assert grouped() == [["w_a", "w_b", "w_c"], ["w_d"]]
    assert grouped(max_layers=2) == [["w_a", "w_b"], ["w_c"], ["w_d"]]


def test_block_reconstruction_is_built_for_openvino_with_the_learned_integers_in_the_ir(tmp_path):
    model = tmp_path / "model.onnx"
    onnx.save(build_block_sensitive_mlp(), model)
    calibration = write_npz(tmp_path / "calibration.npz", input=block_inputs(samples=128, seed=1))
    built = build_variant(model_path=model, precision="int8", out_path=tmp_path / "brecq.openvino.tar", calibration_path=calibration,
                          options={"runtime": "openvino", "learn": "brecq", "learn_seconds": 3})
    recipe = built["recipe"]["learned"]
    assert built["format"] == "openvino-ir" and recipe["method"] == "brecq" and recipe["blocks"] == 1
    # Both layers of the block are on NNCF's grid, and the IR's int8 weights are the learned ones.
    assert recipe["ir_weights_learned"] == {"layers_found": 2, "layers_learned": 2, "equal_share_min": 1.0, "equal_share_mean": 1.0}
