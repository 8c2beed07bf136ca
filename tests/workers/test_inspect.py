"""validate_onnx and inspect_onnx on real, external-data, corrupt and truncated models."""

from __future__ import annotations

import math

import onnx
import pytest
from onnx import TensorProto, helper

from tests.fixtures.models import save_with_external_data
from workers.inspect import InvalidModel, inspect_onnx, model_size_bytes, validate_onnx


def test_valid_model_passes(digits_path):
    assert validate_onnx(digits_path) == {"ok": True, "error": None}


def test_external_data_model_passes(transformer, tmp_path):
    assert validate_onnx(save_with_external_data(transformer, tmp_path)) == {"ok": True, "error": None}


def test_missing_external_data_fails(transformer, tmp_path):
    path = save_with_external_data(transformer, tmp_path)
    (tmp_path / "model.onnx.data").unlink()
    result = validate_onnx(path)
    assert result["ok"] is False and result["error"]


@pytest.mark.parametrize(
    "content",
    [b"", b"\x00\xff" * 64, b"this is a text file, not a model\n" * 20],
    ids=["empty", "garbage", "text"],
)
def test_non_onnx_bytes_fail_with_a_message(tmp_path, content):
    path = tmp_path / "upload.onnx"
    path.write_bytes(content)
    result = validate_onnx(path)
    assert result["ok"] is False
    assert "ONNX" in result["error"] or "empty" in result["error"]
    with pytest.raises(InvalidModel):
        inspect_onnx(path)


def test_truncated_model_fails(digits_path, tmp_path):
    data = digits_path.read_bytes()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: len(data) // 2])
    result = validate_onnx(path)
    assert result["ok"] is False and "truncated" in result["error"]
    with pytest.raises(InvalidModel, match="not a readable ONNX model"):
        inspect_onnx(path)


def test_checker_rejection_is_reported(tmp_path):
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    path = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    result = validate_onnx(path)
    assert result["ok"] is False and "checker" in result["error"]


def test_missing_file_is_not_an_exception(tmp_path):
    assert validate_onnx(tmp_path / "nope.onnx")["ok"] is False


def test_inspect_digits(digits_path):
    info = inspect_onnx(digits_path)
    assert info["signature"] == {
        "inputs": [{"name": "input", "dtype": "float32", "shape": ["batch", 1, 8, 8]}],
        "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 10]}],
    }
    assert info["opset"] == 17
    assert info["op_histogram"] == {"Conv": 2, "Relu": 2, "MaxPool": 2, "Flatten": 1, "Gemm": 1}
    # conv1 16*1*3*3+16, conv2 32*16*3*3+32, fc 10*128+10
    assert info["parameter_count"] == 160 + 4640 + 1290
    assert info["ir_version"] == 8
    assert info["producer"] == "kiln-tests-digits"


def test_weights_held_in_constant_nodes_are_counted(digits_path, tmp_path):
    """An exporter that stores every weight as a Constant node gives a graph without initializers."""
    model = onnx.load(str(digits_path))
    constants = [helper.make_node("Constant", [], [tensor.name], value=tensor) for tensor in model.graph.initializer]
    shape = helper.make_node("Constant", [], ["shape"], value=helper.make_tensor("shape", TensorProto.INT64, [2], [1, -1]))
    del model.graph.initializer[:]
    nodes = [*constants, shape, *model.graph.node]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, str(tmp_path / "constants.onnx"))
    assert inspect_onnx(tmp_path / "constants.onnx")["parameter_count"] == 160 + 4640 + 1290


def test_inspect_never_reads_external_weights(transformer, tmp_path):
    path = save_with_external_data(transformer, tmp_path)
    (tmp_path / "model.onnx.data").unlink()
    info = inspect_onnx(path)
    assert info["parameter_count"] == sum(math.prod(t.dims) for t in transformer.graph.initializer)


def test_inspect_excludes_initializers_and_reports_unknown_dims(tmp_path):
    weight = helper.make_tensor("w", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    node = helper.make_node("Add", ["x", "w"], ["y"])
    x = helper.make_tensor_value_info("x", TensorProto.INT64, [None, 3])
    graph = helper.make_graph(
        [node], "g", [x, helper.make_tensor_value_info("w", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)], [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    info = inspect_onnx(path)
    assert info["signature"]["inputs"] == [{"name": "x", "dtype": "int64", "shape": ["?", 3]}]
    assert info["signature"]["outputs"] == [{"name": "y", "dtype": "int64", "shape": None}]
    assert info["parameter_count"] == 3 and info["opset"] == 13


def test_model_size_counts_external_data(transformer, tmp_path):
    path = save_with_external_data(transformer, tmp_path)
    assert model_size_bytes(path) == path.stat().st_size + (tmp_path / "model.onnx.data").stat().st_size


def _graph_model(nodes, outputs, initializers=(), input_shape=("batch", 8)):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(input_shape))],
                              outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _weight(name, shape):
    import numpy as np

    return onnx.numpy_helper.from_array(np.ones(shape, dtype=np.float32), name)


@pytest.mark.parametrize("nodes, output_shape, dtype, kind", [
    ([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], ["batch", 8], TensorProto.FLOAT, "class_scores"),
    ([helper.make_node("ArgMax", ["x"], ["y"], axis=-1, keepdims=0)], ["batch"], TensorProto.INT64, "class_ids"),
    ([helper.make_node("Sigmoid", ["x"], ["y"])], ["batch", 8], TensorProto.FLOAT, "probability_map"),
    ([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])], ["batch", 3], TensorProto.FLOAT,
     "class_scores"),
    ([helper.make_node("LpNormalization", ["x"], ["y"], axis=-1, p=2)], ["batch", 8], TensorProto.FLOAT, "embedding"),
    ([helper.make_node("Relu", ["x"], ["y"])], ["batch", 8], TensorProto.FLOAT, "regression"),
])
def test_output_kinds_follow_the_producing_op(nodes, output_shape, dtype, kind):
    from workers.inspect import infer_output_kinds

    model = _graph_model(nodes, [helper.make_tensor_value_info("y", dtype, output_shape)], [_weight("w", (8, 3)), _weight("b", (3,))])
    assert infer_output_kinds(model)["y"]["kind"] == kind


def test_spatial_outputs_in_zero_to_one_become_probability_maps_once_values_are_known():
    import numpy as np

    from workers.inspect import infer_output_kinds

    model = _graph_model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 1, 4, 4])],
                         input_shape=("b", 1, 4, 4))
    assert infer_output_kinds(model)["y"]["kind"] == "dense"
    values = {"y": np.random.default_rng(0).uniform(0, 1, (2, 1, 4, 4))}
    refined = infer_output_kinds(model, values)["y"]
    assert refined["kind"] == "probability_map" and refined["source"] == "reference"
    assert infer_output_kinds(model, {"y": values["y"] * 5})["y"]["kind"] == "dense"


def test_separate_boxes_and_scores_outputs_form_one_detection_head():
    from workers.inspect import infer_output_kinds

    nodes = [helper.make_node("MatMul", ["x", "wb"], ["boxes_flat"]), helper.make_node("Reshape", ["boxes_flat", "box_shape"], ["boxes"]),
             helper.make_node("MatMul", ["x", "ws"], ["scores_flat"]), helper.make_node("Reshape", ["scores_flat", "score_shape"], ["logits"]),
             helper.make_node("Sigmoid", ["logits"], ["scores"])]
    import numpy as np

    shapes = [onnx.numpy_helper.from_array(np.array([-1, 6, 4], np.int64), "box_shape"),
              onnx.numpy_helper.from_array(np.array([-1, 6, 3], np.int64), "score_shape")]
    model = _graph_model(nodes, [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["batch", 6, 4]),
                                 helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 6, 3])],
                         [_weight("wb", (8, 24)), _weight("ws", (8, 18)), *shapes])
    kinds = infer_output_kinds(model)
    assert kinds["scores"]["kind"] == "detection" and kinds["scores"]["boxes"] == "boxes"
    assert kinds["boxes"]["kind"] == "detection" and kinds["boxes"]["scores"] == "scores"


def _exp_then_divide(by_sum: bool):
    """Logits through Exp, divided by their ReduceSum (a softmax written out, as some exporters do) or by a constant."""
    import numpy as np

    divisor = "total" if by_sum else "three"
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("Exp", ["logits"], ["e"]),
             helper.make_node("ReduceSum", ["e", "axes"], ["total"], keepdims=1), helper.make_node("Div", ["e", divisor], ["y"])]
    rng = np.random.default_rng(0)
    initializers = [onnx.numpy_helper.from_array(rng.standard_normal((8, 5)).astype(np.float32), "w"),
                    onnx.numpy_helper.from_array(np.array([-1], np.int64), "axes"), onnx.numpy_helper.from_array(np.array(3.0, np.float32), "three")]
    return _graph_model(nodes, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])], initializers)


@pytest.mark.parametrize("by_sum, kind, metric", [(True, "class_scores", "top1_agreement"), (False, "regression", "relative_l2")])
def test_a_softmax_written_as_exp_reducesum_div_is_told_by_its_graph_and_its_values(by_sum, kind, metric):
    import numpy as np
    import onnxruntime as ort

    from kiln_contract import contract, metrics
    from workers.inspect import infer_output_kinds

    model = _exp_then_divide(by_sum)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    reference = {"y": session.run(None, {"x": np.random.default_rng(1).standard_normal((6, 8)).astype(np.float32)})[0]}
    # The graph alone: Exp over its own ReduceSum is a softmax written out; Exp over a constant is not.
    assert infer_output_kinds(model)["y"]["kind"] == ("class_scores" if by_sum else "regression")
    inferred = infer_output_kinds(model, reference)["y"]
    assert inferred["kind"] == kind
    plan = contract.evaluation_plan(output_kinds={"y": inferred}, output_order=["y"], declared=[], has_labels=False)
    result = metrics.evaluate({"y": reference["y"][:, ::-1]}, reference, plan)["outputs"]["y"]
    assert result["primary_metric"] == metric
    assert (result["metrics"]["top1_agreement"] < 1.0) if by_sum else ("top1_agreement" not in result["metrics"])


def test_per_token_outputs_of_an_encoder_fed_an_attention_mask_name_it():
    from tests.fixtures.models import build_masked_encoder, build_transformer_like
    from workers.inspect import infer_output_kinds

    hidden = infer_output_kinds(build_masked_encoder())["last_hidden_state"]
    assert hidden["kind"] == "embedding" and hidden["mask"] == "attention_mask"
    assert "mask" not in infer_output_kinds(build_transformer_like())["output"]  # no mask input, nothing to leave out
    other_length = build_masked_encoder(seq_len=6)
    other_length.graph.input[1].type.tensor_type.shape.dim[1].dim_value = 7
    assert "mask" not in infer_output_kinds(other_length)["last_hidden_state"]


def test_per_pixel_probabilities_over_axis_one_are_class_scores_not_a_probability_map():
    import numpy as np

    from workers.inspect import infer_output_kinds

    model = _graph_model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 3, 4, 4])],
                         input_shape=("b", 3, 4, 4))
    logits = np.random.default_rng(2).standard_normal((2, 3, 4, 4))
    inferred = infer_output_kinds(model, {"y": np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)})["y"]
    assert inferred["kind"] == "class_scores" and inferred["axis"] == 1
