"""How much work each operator type of an ONNX model does, from its shapes: the unit of latency estimates.

Work is multiply-accumulates for the operators that have them (Conv, ConvTranspose, MatMul, Gemm)
and output elements for everything else. Symbolic dimensions count as 1 (batch 1, as measured).
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
from onnx import shape_inference

# The operators that carry a model's multiply-accumulates and its weights: the latency estimate's "mac" class
# (kiln.reports.estimate), the nodes sensitivity ranks and the search may keep in float (workers/quantize). A tuple, so
# that a recipe listing them (`op_types_to_quantize`) is written in one order in every process.
MAC_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")


def _dims(value_info) -> list[int] | None:
    tensor = value_info.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in tensor.shape.dim]


def _shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:
        inferred = model
    graph = inferred.graph
    shapes = {}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        dims = _dims(info)
        if dims is not None:
            shapes[info.name] = dims
    for initializer in graph.initializer:
        shapes[initializer.name] = list(initializer.dims)
    return shapes


def _node_work(node, shapes: dict[str, list[int]]) -> float:
    out = shapes.get(node.output[0]) if node.output else None
    out_elems = float(np.prod(out)) if out else 1.0
    if node.op_type in ("Conv", "ConvTranspose") and len(node.input) > 1 and node.input[1] in shapes:
        weight = shapes[node.input[1]]
        # Each output element takes Cin/group * kernel MACs; the weight's dims after the first are exactly that.
        return out_elems * float(np.prod(weight[1:])) if node.op_type == "Conv" else float(np.prod(weight)) * float(np.prod(shapes.get(node.input[0], [1])[2:]))
    if node.op_type in ("MatMul", "Gemm") and node.input and node.input[0] in shapes:
        left = shapes[node.input[0]]
        inner = left[-2] if node.op_type == "Gemm" and any(a.name == "transA" and a.i for a in node.attribute) else left[-1]
        return out_elems * float(inner)
    return out_elems


def op_work(model_path: str | Path) -> dict[str, float]:
    """Work per operator type of a model file (external data is not loaded: shapes are enough)."""
    model = onnx.load(str(model_path), load_external_data=False)
    shapes = _shapes(model)
    work: dict[str, float] = defaultdict(float)
    for node in model.graph.node:
        work[node.op_type] += _node_work(node, shapes)
    return dict(work)
