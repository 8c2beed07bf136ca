"""Work per operator type from shapes: MACs for the matrix operators, output elements for the rest."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from workers.cost import op_work


def test_conv_matmul_and_elementwise_work_follow_their_shapes(tmp_path):
    weight = numpy_helper.from_array(np.zeros((8, 3, 3, 3), np.float32), "w")
    dense = numpy_helper.from_array(np.zeros((8 * 30 * 30, 10), np.float32), "d")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("Flatten", ["r"], ["f"]), helper.make_node("MatMul", ["f", "d"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])], [weight, dense],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    work = op_work(path)
    # Conv: 8x30x30 outputs (batch 1), each 3x3x3 MACs; MatMul: 10 outputs, each 7200 MACs.
    assert work["Conv"] == 8 * 30 * 30 * 27
    assert work["MatMul"] == 10 * 8 * 30 * 30
    assert work["Relu"] == 8 * 30 * 30 and work["Flatten"] == 8 * 30 * 30
