"""Validate an ONNX file and extract its signature, opset, op histogram and parameter count.

Both functions read only the graph protobuf: external weights are never loaded, so a model of
any size costs about the size of its graph to inspect.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError

# Legacy models (IR < 3) carry no opset_import; the spec says they mean opset 1.
_LEGACY_OPSET = 1


class InvalidModel(ValueError):
    """The file is not a readable ONNX model."""


def validate_onnx(path: str | Path) -> dict[str, Any]:
    """Run the ONNX checker on a file and report `{"ok", "error"}` instead of raising."""
    path = Path(path)
    try:
        _require_nonempty_file(path)
        # The path-based checker follows external data by location, so models over 2 GB work.
        onnx.checker.check_model(str(path), full_check=False)
    except InvalidModel as error:
        return {"ok": False, "error": str(error)}
    except Exception as error:
        return {"ok": False, "error": _describe_checker_error(path, error)}
    return {"ok": True, "error": None}


def inspect_onnx(path: str | Path) -> dict[str, Any]:
    """Describe a model: signature, default-domain opset, op histogram, parameter count, IR version, producer."""
    model = load_graph_only(path)
    graph = model.graph
    initializer_names = {tensor.name for tensor in graph.initializer}
    initializer_names.update(sparse.values.name for sparse in graph.sparse_initializer)
    return {
        "signature": {
            # IR < 4 lists initializers among the inputs; they are weights, not things a caller feeds.
            "inputs": [_describe_value(value) for value in graph.input if value.name not in initializer_names],
            "outputs": [_describe_value(value) for value in graph.output],
        },
        "opset": default_opset(model),
        "op_histogram": dict(Counter(node.op_type for node in graph.node)),
        "parameter_count": _parameter_count(graph),
        "ir_version": int(model.ir_version),
        "producer": " ".join(part for part in (model.producer_name, model.producer_version) if part),
    }


def load_graph_only(path: str | Path) -> onnx.ModelProto:
    """Load a model's protobuf without its external weights, raising InvalidModel if it is unreadable."""
    path = Path(path)
    _require_nonempty_file(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, OSError) as error:
        raise InvalidModel(f"{path.name} is not a readable ONNX model (corrupt, truncated or another format): {error}") from error
    if not model.HasField("graph") or not (model.graph.node or model.graph.output):
        raise InvalidModel(f"{path.name} is not a readable ONNX model: it holds no graph")
    return model


def default_opset(model: onnx.ModelProto) -> int:
    """Return the opset version of the default ONNX domain."""
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            return int(opset.version)
    return _LEGACY_OPSET


def model_files(path: str | Path) -> list[Path]:
    """Return the .onnx file and every external-data file it references (graph read only)."""
    path = Path(path)
    model = load_graph_only(path)
    locations = set()
    for tensor in iter_tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            locations.update(entry.value for entry in tensor.external_data if entry.key == "location")
    return [path, *(path.parent / location for location in sorted(locations))]


def model_size_bytes(path: str | Path) -> int:
    """Return the bytes on disk of a model, external data included."""
    return sum(file.stat().st_size for file in model_files(path) if file.is_file())


def _require_nonempty_file(path: Path) -> None:
    if not path.is_file():
        raise InvalidModel(f"{path.name}: no such file")
    if path.stat().st_size == 0:
        raise InvalidModel(f"{path.name} is empty")


def _describe_checker_error(path: Path, error: Exception) -> str:
    text = str(error).strip() or type(error).__name__
    lowered = text.lower()
    if isinstance(error, DecodeError) or "parse" in lowered or "protobuf" in lowered:
        return f"not a readable ONNX model (corrupt, truncated or another format): {text}"
    # Random bytes sometimes decode as an (empty) protobuf; say "not ONNX" rather than quote the checker.
    try:
        load_graph_only(path)
    except InvalidModel as unreadable:
        return str(unreadable)
    return f"the ONNX checker rejected the model: {text}"


def _describe_value(value: onnx.ValueInfoProto) -> dict[str, Any]:
    tensor_type = value.type.tensor_type if value.type.HasField("tensor_type") else None
    if tensor_type is None:
        # Sequences, maps and optionals have no single dtype or shape to report.
        return {"name": value.name, "dtype": value.type.WhichOneof("value") or "unknown", "shape": None}
    shape = None
    if tensor_type.HasField("shape"):
        shape = [_describe_dim(dim) for dim in tensor_type.shape.dim]
    return {"name": value.name, "dtype": dtype_name(tensor_type.elem_type), "shape": shape}


def _describe_dim(dim: onnx.TensorShapeProto.Dimension) -> int | str:
    if dim.HasField("dim_value"):
        return int(dim.dim_value)
    if dim.HasField("dim_param") and dim.dim_param:
        return dim.dim_param
    return "?"


def dtype_name(elem_type: int) -> str:
    """Name an ONNX tensor element type the way numpy does ("float32", "int64"), or the ONNX name."""
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    except (KeyError, ValueError, TypeError):
        return onnx.TensorProto.DataType.Name(elem_type).lower() if elem_type in onnx.TensorProto.DataType.values() else "unknown"
    # bfloat16 and float8 map to ml_dtypes types whose numpy kind is void; the ONNX name reads better.
    if dtype.kind == "V":
        return onnx.TensorProto.DataType.Name(elem_type).lower()
    return np.dtype(dtype).name


def _parameter_count(graph: onnx.GraphProto) -> int:
    dense = sum(math.prod(tensor.dims) for tensor in graph.initializer)
    sparse = sum(math.prod(tensor.dims) for tensor in graph.sparse_initializer)
    return int(dense + sparse)


def iter_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Yield every tensor a graph can hold data in: initializers, sparse parts, constants, subgraphs."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("sparse_tensor"):
                yield attribute.sparse_tensor.values
                yield attribute.sparse_tensor.indices
            if attribute.HasField("g"):
                yield from iter_tensors(attribute.g)
            for subgraph in attribute.graphs:
                yield from iter_tensors(subgraph)
