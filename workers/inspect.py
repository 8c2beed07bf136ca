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

from kiln_contract.metrics import rows_sum_to_one, smooth_peaked_rows

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


# The protobuf parser's depth limit (upb says "MaxDepth", the C++ runtime "too deep"): an If, Loop or Scan body is a
# graph inside a node inside a graph, so about 30 levels of control flow reach it.
PROTOBUF_DEPTH_LIMIT = 100
NESTING_LIMIT = "nesting limit"
_TOO_DEEP = ("maxdepth", "too deep", "recursion")


def load_graph_only(path: str | Path) -> onnx.ModelProto:
    """Load a model's protobuf without its external weights, raising InvalidModel if it is unreadable."""
    path = Path(path)
    _require_nonempty_file(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, OSError, RecursionError) as error:
        if any(marker in str(error).lower() for marker in _TOO_DEEP) or isinstance(error, RecursionError):
            raise InvalidModel(f"the model nests subgraphs (If, Loop or Scan bodies) deeper than the ONNX parser's {NESTING_LIMIT} "
                               f"of {PROTOBUF_DEPTH_LIMIT} protobuf levels, so it cannot be read") from None
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
        # The path-based checker says only "Unable to parse proto"; the parser itself says why (a nesting limit, say).
        try:
            load_graph_only(path)
        except InvalidModel as unreadable:
            if NESTING_LIMIT in str(unreadable):
                return str(unreadable)
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


FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}


def _parameter_count(graph: onnx.GraphProto) -> int:
    """Weights in initializers, and in floating-point Constant nodes: some exporters store every weight as a
    Constant (the model page once said "Parameters 0"). Integer constants are shapes and indices, not weights."""
    dense = sum(math.prod(tensor.dims) for tensor in graph.initializer)
    sparse = sum(math.prod(tensor.dims) for tensor in graph.sparse_initializer)
    constants = sum(
        math.prod(attribute.t.dims)
        for node in graph.node if node.op_type == "Constant" and node.domain in ("", "ai.onnx")
        for attribute in node.attribute
        if attribute.name == "value" and attribute.t.data_type in FLOAT_TYPES and attribute.t.dims
    )
    return int(dense + sparse + constants)


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


# ---------------------------------------------------------------------------------------------
# Output kinds

# Ops that move or relabel values without changing what they mean (calibration keeps what reaches an output through
# them whole too: workers.quantize.calibration_methods).
PASS_THROUGH = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Cast", "Slice", "Gather", "Expand"}
_EMBEDDING_NAMES = ("embed", "hidden", "pool", "feature", "encod", "vector", "latent")
_DETECTION_STRIDES = (8, 16, 32)


def infer_output_kinds(model: onnx.ModelProto | str | Path, reference: dict[str, np.ndarray] | None = None) -> dict[str, dict[str, Any]]:
    """A kind per output (see kiln_contract.contract.OUTPUT_KINDS) with the reason, from the producing op,
    the shape and, when given, FP32's reference values (`[samples, ...]` per output).

    Each value is `{"kind", "reason", "source"}` plus what the kind's metric needs (the class
    axis of per-pixel scores; a detection head's layout and grid; the attention mask input whose
    kept tokens per-token outputs are judged on).
    """
    if not isinstance(model, onnx.ModelProto):
        model = load_graph_only(model)
    graph = model.graph
    producers = {output: node for node in graph.node for output in node.output}
    ops = {node.op_type for node in graph.node}
    initializers = {tensor.name for tensor in graph.initializer}
    inputs = [value for value in graph.input if value.name not in initializers]
    kinds: dict[str, dict[str, Any]] = {}
    shapes: dict[str, list | None] = {}
    for value in graph.output:
        described = _describe_value(value)
        shape = described["shape"]
        if reference is not None and value.name in reference:
            shape = ["N", *np.asarray(reference[value.name]).shape[1:]]
        kinds[value.name] = _infer_kind(value.name, described["dtype"], shape, producers, ops, inputs, opset=default_opset(model),
                                        values=None if reference is None else reference.get(value.name))
        shapes[value.name] = shape
    _pair_boxes_and_scores(kinds, shapes)
    _attach_token_mask(kinds, shapes, inputs)
    return kinds


def _token_mask_input(inputs) -> tuple[str, int | str] | None:
    """An attention mask input: named like `attention_mask`, `[N, T]` (or `[N, 1, 1, T]`); its name and T."""
    for value in inputs:
        shape = _describe_value(value)["shape"]
        if "mask" in value.name.lower() and shape and 2 <= len(shape) <= 4 and all(dim == 1 for dim in shape[1:-1]):
            return value.name, shape[-1]
    return None


def _attach_token_mask(kinds: dict[str, dict[str, Any]], shapes: dict[str, list | None], inputs) -> None:
    """Per-token outputs of an encoder fed an attention mask (`[N, T, H]` hidden states, `[N, T, C]`
    token scores) are judged on the tokens the mask keeps: the plan names the mask input for the agent."""
    found = _token_mask_input(inputs)
    if found is None:
        return
    mask, tokens = found
    for name, shape in shapes.items():
        kind = kinds[name]
        if kind["kind"] not in ("embedding", "class_scores") or "axis" in kind or not shape or len(shape) < 3:
            continue
        if isinstance(shape[-2], int) and isinstance(tokens, int) and shape[-2] != tokens:
            continue
        kind["mask"] = mask
        kind["reason"] += f"; judged on the tokens input {mask!r} keeps, padding left out"


def _pair_boxes_and_scores(kinds: dict[str, dict[str, Any]], shapes: dict[str, list | None]) -> None:
    """A detector with separate outputs: boxes `[N, A, 4]` next to scores `[N, A, C]` over the same anchors."""
    boxes = [name for name, shape in shapes.items() if shape and len(shape) == 3 and shape[2] == 4]
    for box_name in boxes:
        anchors = shapes[box_name][1]
        scores = [name for name, shape in shapes.items() if name != box_name and shape and len(shape) == 3 and shape[1] == anchors
                  and kinds[name]["kind"] in ("class_scores", "probability_map", "regression", "embedding")]
        if len(scores) != 1:
            continue
        reason = f"boxes {box_name!r} [N, A, 4] with scores {scores[0]!r} over the same anchors: a detection head in two outputs"
        kinds[scores[0]] = _kind("detection", reason, boxes=box_name, layout="channels_last", objectness=False)
        kinds[box_name] = _kind("detection", reason, scores=scores[0], layout="channels_last", objectness=False)


def _chain(name: str, producers: dict[str, onnx.NodeProto]) -> tuple[onnx.NodeProto | None, list[str]]:
    """The first producer that is not a pass-through op, and the pass-through ops on the way."""
    passed = []
    node = producers.get(name)
    for _ in range(16):
        if node is None or node.op_type not in PASS_THROUGH or not node.input:
            break
        passed.append(node.op_type)
        node = producers.get(node.input[0])
    return node, passed


def _ancestors_have(node: onnx.NodeProto, producers: dict[str, onnx.NodeProto], op_type: str, depth: int) -> bool:
    frontier, seen = [node], set()
    for _ in range(depth):
        following = []
        for current in frontier:
            for name in current.input:
                parent = producers.get(name)
                if parent is not None and id(parent) not in seen:
                    if parent.op_type == op_type:
                        return True
                    seen.add(id(parent))
                    following.append(parent)
        frontier = following
    return False


def _kind(kind: str, reason: str, source: str = "graph", **options) -> dict[str, Any]:
    return {"kind": kind, "reason": reason, "source": source, **options}


def _infer_kind(name: str, dtype: str, shape: list | None, producers, ops: set[str], inputs, *, opset: int, values) -> dict[str, Any]:
    node, _ = _chain(name, producers)
    if node is not None and node.op_type == "Add" and producers.get(node.input[0]) is not None \
            and producers[node.input[0]].op_type in ("MatMul", "Gemm"):
        node = producers[node.input[0]]  # a linear layer's bias
    op = node.op_type if node is not None else None
    rank = len(shape) if shape is not None else None
    static = [dim for dim in (shape or [])[1:]]
    if dtype.startswith(("int", "uint", "bool")):
        return _kind("class_ids", f"{dtype} output" + (f" of {op}" if op else ""))
    if op in ("ArgMax", "ArgMin"):
        return _kind("class_ids", f"produced by {op}")
    if op == "TopK":
        produced_index = list(node.output).index(_producer_output(name, producers, node))
        return _kind("class_ids", "TopK indices") if produced_index == 1 else _kind("regression", "TopK values")
    distribution = _distribution(op, rank, values)
    if distribution is not None:
        return distribution
    if op in ("Softmax", "LogSoftmax"):
        axis = next((attribute.i for attribute in node.attribute if attribute.name == "axis"), -1 if opset >= 13 else 1)
        if rank and rank >= 3 and (axis % rank) == 1:
            return _kind("class_scores", f"{op} over axis 1 of a rank-{rank} output: class scores per position", axis=1)
        return _kind("class_scores", f"{op} over the last axis" + (": class scores per position" if rank and rank >= 3 else ""))
    detection = _detection(node, shape, producers, ops, inputs)
    if detection is not None:
        return detection
    probabilities = _class_probabilities(op, rank, values)
    if probabilities is not None:
        return probabilities
    if op == "Div" and _is_written_out_softmax(node, producers):
        # Without FP32's values (which also tell the axis), the graph's own pattern: Magika's JAX export ends this way.
        return _kind("class_scores", "a softmax written out as Exp / ReduceSum / Div: class probabilities over the last axis")
    if op == "Sigmoid" and rank == 4 and shape[1] == 1 and all(isinstance(dim, str) or dim > 1 for dim in shape[2:]):
        return _kind("heat_map", "Sigmoid output of one channel per pixel: a heat map users threshold into regions, judged by "
                     "the regions and the peak it gives, not the mask IoU of its whole foreground")
    if op == "Sigmoid":
        return _kind("probability_map", "Sigmoid output: independent probabilities" + (" per pixel" if rank and rank >= 4 else ""))
    if op in ("LpNormalization", "LayerNormalization") or any(hint in name.lower() for hint in _EMBEDDING_NAMES):
        return _kind("embedding", f"produced by {op}" if op in ("LpNormalization", "LayerNormalization") else f"named {name!r}")
    if op == "Div" and _ancestors_have(node, producers, "ReduceL2", 3):
        return _kind("embedding", "L2-normalized vectors")
    if _unit_rows(rank, values):
        return _kind("embedding", f"{op} output whose FP32 rows all have L2 norm 1: embeddings, judged by cosine and nearest "
                     "neighbours, not relative L2", source="reference")
    if op in ("Gemm", "MatMul") and rank is not None and rank >= 2 and (not isinstance(static[-1], int) or static[-1] >= 2):
        return _kind("class_scores", f"{op} logits over the last axis" + (" per position" if rank >= 3 else ""))
    if rank == 3:
        return _kind("embedding", f"[N, T, D] output of {op}: hidden states")
    guessed = _kind("dense" if rank and rank >= 4 else "regression", f"rank-{rank} output of {op}" if rank else f"output of {op}", source="shape")
    if values is not None:
        finite = np.asarray(values)[np.isfinite(values)]
        if rank and rank >= 4 and finite.size and finite.min() >= 0.0 and finite.max() <= 1.0:
            return _kind("probability_map", f"spatial output of {op} with every FP32 value in [0, 1]", source="reference")
    return guessed


# Ops that only move or broadcast a ReduceSum's result back to its input's shape (JAX and TF exports reshape and expand it).
_BROADCASTS = {"Reshape", "Expand", "Unsqueeze", "Squeeze", "Identity", "Cast"}


def _is_written_out_softmax(div: onnx.NodeProto, producers: dict[str, onnx.NodeProto]) -> bool:
    """Div(Exp(x), broadcast(ReduceSum(Exp(x)))): the numerator's Exp is the very tensor the denominator sums."""
    numerator = producers.get(div.input[0])
    if numerator is None or numerator.op_type != "Exp":
        return False
    denominator = producers.get(div.input[1])
    for _ in range(8):
        if denominator is None or denominator.op_type not in _BROADCASTS:
            break
        denominator = producers.get(denominator.input[0])
    return denominator is not None and denominator.op_type == "ReduceSum" and denominator.input[0] == numerator.output[0]


def _class_probabilities(op: str | None, rank: int | None, values) -> dict[str, Any] | None:
    """Class scores known from FP32's values: rows that are non-negative and sum to 1 (a softmax
    written out as Exp / ReduceSum / Div), over the last axis or, per pixel, over axis 1."""
    if values is None or not rank or rank < 2:
        return None
    if rows_sum_to_one(values, -1):
        return _kind("class_scores", f"{op} output whose FP32 rows are non-negative and sum to 1: class probabilities", source="reference")
    if rank >= 3 and rows_sum_to_one(values, 1):
        return _kind("class_scores", f"{op} output whose FP32 values over axis 1 are non-negative and sum to 1: class probabilities "
                     "per position", source="reference", axis=1)
    return None


def _distribution(op: str | None, rank: int | None, values) -> dict[str, Any] | None:
    """Sigmoid or softmax values over ordered bins, known from FP32's rows: a clear peak whose neighbours carry part of it
    (a blurred one-hot, as CREPE's 360 pitch bins), decoded around the peak; independent classes have no such neighbours."""
    if values is None or op not in ("Sigmoid", "Softmax") or rank not in (2, 3) or not smooth_peaked_rows(values):
        return None
    bins = np.asarray(values).shape[-1]
    return _kind("distribution", f"{op} over {bins} ordered bins whose FP32 rows peak smoothly (neighbouring bins share the "
                 "peak): a distribution decoded around its peak, judged by the decoded value and the peak", source="reference")


def _unit_rows(rank: int | None, values) -> bool:
    if values is None or rank != 2:
        return False
    array = np.asarray(values, np.float64)
    if array.shape[-1] < 8 or not np.isfinite(array).all():
        return False
    return bool(np.all(np.abs(np.linalg.norm(array, axis=-1) - 1.0) <= 1e-3))


def _producer_output(name: str, producers, node: onnx.NodeProto) -> str:
    """The output of `node` that leads (through pass-through ops) to graph output `name`."""
    current = name
    for _ in range(16):
        parent = producers.get(current)
        if parent is node:
            return current
        if parent is None or not parent.input:
            break
        current = parent.input[0]
    return name


def _detection(node, shape: list | None, producers, ops: set[str], inputs) -> dict[str, Any] | None:
    """YOLO-style heads: [N, 4+C, A] (fields first, v8) or [N, A, 5+C] (v5, YOLOX) built by Concat around a Sigmoid."""
    if node is None or node.op_type != "Concat" or shape is None:
        return None
    dims = [dim for dim in shape[1:] if dim != 1]
    if len(dims) != 2 or not _ancestors_have(node, producers, "Sigmoid", 4):
        return None
    first, second = dims
    if isinstance(first, int) and 5 <= first <= 300 and (not isinstance(second, int) or second >= 3 * first):
        return _kind("detection", f"Concat of boxes and Sigmoid scores, [N, {first}, anchors]: a YOLOv8-style head", layout="channels_first")
    if isinstance(second, int) and 5 <= second <= 300 and (not isinstance(first, int) or first >= 3 * second):
        options: dict[str, Any] = {"layout": "channels_last"}
        reason = f"Concat of boxes and Sigmoid scores, [N, anchors, {second}]: a YOLOv5/YOLOX-style head with objectness"
        grid = _raw_grid(first, ops, inputs)
        if grid is not None:
            options["grid"] = grid
            reason += f"; boxes are raw grid offsets (strides {', '.join(map(str, grid['strides']))}, no decode in the graph)"
        return _kind("detection", reason, **options)
    return None


def _raw_grid(anchors, ops: set[str], inputs) -> dict[str, Any] | None:
    """The YOLOX grid when the anchor count is that of strides 8/16/32 on the static input and the graph never decodes boxes."""
    if not isinstance(anchors, int) or {"Exp", "Pow", "Softmax"} & ops or len(inputs) != 1:
        return None
    shape = _describe_value(inputs[0])["shape"] or []
    if len(shape) != 4 or not all(isinstance(dim, int) and dim > 0 for dim in shape[2:]):
        return None
    height, width = shape[2], shape[3]
    if sum((height // stride) * (width // stride) for stride in _DETECTION_STRIDES) != anchors:
        return None
    return {"strides": list(_DETECTION_STRIDES), "input_hw": [height, width]}


def inspect_upload(request: dict, work: Path) -> dict[str, Any]:
    """The sandbox's `onnx.inspect` command: the checker's verdict, the model's description and its output kinds.

    Runs confined (workers/sandbox) because the ONNX checker and the protobuf parser are native code
    reading a user's file; the web process only reads the answer.
    """
    path = Path(request["model"])
    validation = validate_onnx(path)
    if not validation["ok"]:
        return {"validation": validation}
    facts = inspect_onnx(path)
    try:
        kinds = infer_output_kinds(path)
    except Exception as error:  # a model the heuristics cannot read still uploads (the job infers again from values)
        kinds, facts["output_kinds_error"] = {}, f"{type(error).__name__}: {error}"
    return {"validation": validation, "facts": facts, "output_kinds": kinds}


def validate_command(request: dict, work: Path) -> dict[str, Any]:
    """The sandbox's `onnx.validate` command: the ONNX checker's verdict on a job's model (the validate stage)."""
    return {"validation": validate_onnx(Path(request["model"]))}
