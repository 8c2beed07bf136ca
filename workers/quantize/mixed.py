"""Weight-only mixes: INT4 MatMul weights with the most sensitive ones in INT8, and Gemm → MatMul so Gemms can take part.

The INT8 share uses the same operator as the INT4 one (`com.microsoft.MatMulNBits`, bits=8), so a
mix needs no runtime feature that plain INT4 does not: both ONNX Runtime and OpenVINO's ONNX
frontend load it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper


def gemm_to_matmul(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """Rewrite each Gemm with a constant B (alpha = beta = 1, no transA) as MatMul (+ Add for C).

    The MatMul keeps the Gemm's name, so node names from a sensitivity ranking still apply.
    Returns a new model and the names of the rewritten nodes.
    """
    converted = onnx.ModelProto()
    converted.CopyFrom(model)
    initializers = {tensor.name: tensor for tensor in converted.graph.initializer}
    rewritten: list[str] = []
    nodes: list[onnx.NodeProto] = []
    for node in converted.graph.node:
        attributes = {attr.name: helper.get_attribute_value(attr) for attr in node.attribute}
        plain = (attributes.get("alpha", 1.0) == 1.0 and attributes.get("beta", 1.0) == 1.0
                 and not attributes.get("transA", 0))
        if node.op_type != "Gemm" or not plain or node.input[1] not in initializers:
            nodes.append(node)
            continue
        weight = numpy_helper.to_array(initializers[node.input[1]])
        if attributes.get("transB", 0):
            weight = np.ascontiguousarray(weight.T)
        weight_name = f"{node.input[1]}.as_matmul"
        converted.graph.initializer.append(numpy_helper.from_array(weight, weight_name))
        has_bias = len(node.input) > 2 and node.input[2]
        product = f"{node.output[0]}.matmul" if has_bias else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], weight_name], [product], name=node.name))
        if has_bias:
            nodes.append(helper.make_node("Add", [product, node.input[2]], [node.output[0]], name=f"{node.name}.bias"))
        rewritten.append(node.name)
    del converted.graph.node[:]
    converted.graph.node.extend(nodes)
    _drop_unused_initializers(converted)
    return converted, rewritten


def quantize_matmul_weights(
    model: onnx.ModelProto,
    *,
    block_size: int,
    symmetric: bool,
    nodes_to_exclude: list[str],
    int8_nodes: list[str],
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """Quantize MatMul weights to INT4, those in `int8_nodes` to INT8 instead; return the model and counts."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    int8_nodes = [name for name in int8_nodes if name not in set(nodes_to_exclude)]
    # MatMulNBitsQuantizer rewrites the proto it is given; the caller's model must stay intact.
    working = onnx.ModelProto()
    working.CopyFrom(model)
    four_bit = MatMulNBitsQuantizer(
        working, bits=4, block_size=block_size, is_symmetric=symmetric,
        nodes_to_exclude=[*nodes_to_exclude, *int8_nodes], op_types_to_quantize=("MatMul",),
    )
    four_bit.process()
    quantized = four_bit.model.model
    counts = {"int4": _count_nbits(quantized, 4), "int8": 0}
    if int8_nodes:
        eight_bit = MatMulNBitsQuantizer(
            quantized, bits=8, block_size=block_size, is_symmetric=symmetric,
            nodes_to_include=int8_nodes, op_types_to_quantize=("MatMul",),
        )
        eight_bit.process()
        quantized = eight_bit.model.model
        counts["int8"] = _count_nbits(quantized, 8)
    return quantized, counts


def _count_nbits(model: onnx.ModelProto, bits: int) -> int:
    return sum(
        1 for node in model.graph.node
        if node.op_type == "MatMulNBits" and any(attr.name == "bits" and attr.i == bits for attr in node.attribute)
    )


def _drop_unused_initializers(model: onnx.ModelProto) -> None:
    used = {name for node in model.graph.node for name in node.input}
    used |= {value.name for value in model.graph.output}
    keep = [tensor for tensor in model.graph.initializer if tensor.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
