"""Load a checked PyTorch file, export it to ONNX and compare the two. Runs only inside the sandbox (child.py).

The exporter's dynamo path (torch.export -> ONNX) is tried first; when it fails, the TorchScript-based
exporter is used and the reason is kept. Parity is cosine similarity and max abs error per output,
PyTorch against ONNX Runtime on the same inputs.
"""
from __future__ import annotations

import io
import pickle
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from kiln_contract.metrics import cosine_similarity, max_abs_error

from .operators import check as check_operators_allowed
from .scan import TORCH_EXPORT

PARITY_MIN_COSINE = 1 - 1e-4
OPSET = 18
_NON_OPS = {"prim::Constant", "prim::GetAttr", "prim::ListConstruct", "prim::TupleConstruct", "prim::TupleUnpack",
            "prim::ListUnpack", "prim::NumToTensor"}


@dataclass
class LoadedModel:
    kind: str
    module: torch.nn.Module
    program: object | None
    inputs: list[dict]
    op_histogram: dict = field(default_factory=dict)
    parameter_count: int = 0


def load_model(kind: str, path: Path, *, check_operators: bool = True) -> LoadedModel:
    """Load a checked file; before anything runs, every operator it would call must be on the allow-list."""
    if kind == TORCH_EXPORT:
        program = torch.export.load(str(path))
        if check_operators:
            check_operators_allowed(_program_operators(program), where="The model")
        module = program.module()
        histogram = Counter(str(node.target) for node in program.graph.nodes if node.op == "call_function")
        parameters = sum(int(value.numel()) for value in program.state_dict.values())
        return LoadedModel(kind, module, program, _export_input_specs(program), dict(histogram), parameters)
    module = torch.jit.load(str(path), map_location="cpu")
    if check_operators:
        check_operators_allowed(_script_operators(module), where="The model")
    module.eval()
    histogram = Counter(node.kind() for node in module.inlined_graph.nodes() if node.kind() not in _NON_OPS)
    parameters = sum(int(p.numel()) for p in module.parameters())
    return LoadedModel(kind, module, None, _traced_input_specs(path, module), dict(histogram), parameters)


def _program_operators(program) -> set[str]:
    """Every call_function target of a torch.export program, its nested graphs (cond, loops) included."""
    found = set()
    for graph_module in program.graph_module.modules():
        if isinstance(graph_module, torch.fx.GraphModule):
            for node in graph_module.graph.nodes:
                if node.op == "call_function":
                    found.add(_target_name(node.target))
    return found


def _target_name(target) -> str:
    name = getattr(target, "name", None)
    if callable(name) and isinstance(getattr(target, "namespace", None), str):
        return name() if "::" in name() else f"{target.namespace}::{name()}"
    return f"{getattr(target, '__module__', None) or 'builtins'}::{getattr(target, '__name__', str(target))}"


def _script_operators(module) -> set[str]:
    """Every node kind of each method TorchScript compiled, of the module and of every submodule (`__setstate__` and the
    helpers it calls included), calls inlined and nested blocks included.

    Methods are read from the compiled module (`_c._get_method`), never through Python attribute lookup, which finds
    the Python class's own `__setstate__` (a function without a graph) instead of the compiled one.
    """
    found: set[str] = set()
    graphs = [module.inlined_graph]
    for submodule in module.modules():
        compiled = submodule._c
        graphs.extend(compiled._get_method(name).graph for name in compiled._method_names())
    # `graphs` holds every graph to the end: a block (an if's branch, a loop's body) is only valid while its graph lives.
    pending = list(graphs)
    while pending:
        block = pending.pop()
        for node in block.nodes():
            found.add(node.kind())
            pending.extend(node.blocks())
    return found


def _dim(value) -> int | str:
    return int(value) if isinstance(value, int) or str(value).isdigit() else str(value)


def _export_input_specs(program) -> list[dict]:
    user_inputs = set(program.graph_signature.user_inputs)
    specs = []
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in user_inputs:
            value = node.meta.get("val")
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"input {node.name!r} is not a tensor; only tensor inputs are supported")
            specs.append({"name": node.name, "dtype": str(value.dtype).removeprefix("torch."), "shape": [_dim(d) for d in value.shape]})
    return specs


class _TracedInputsUnpickler(pickle.Unpickler):
    """Reads only the shapes and dtypes of `traced_inputs.pkl` (checked by scan.py): no tensor, no code."""

    def find_class(self, module, name):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda storage, offset, size, *rest: {"dtype": storage, "shape": list(size)}
        if (module, name) == ("torch.jit._pickle", "restore_type_tag"):
            return lambda value, tag: value
        if (module, name) == ("collections", "OrderedDict"):
            return dict
        if module == "torch" and name.endswith("Storage"):
            return name
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed here")

    def persistent_load(self, pid):
        storage_type = pid[1]
        return {"FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16", "LongStorage": "int64",
                "IntStorage": "int32", "BoolStorage": "bool", "ByteStorage": "uint8", "CharStorage": "int8"}.get(storage_type, "float32")


def _traced_input_specs(path: Path, module) -> list[dict]:
    with zipfile.ZipFile(path) as archive:
        entry = next((name for name in archive.namelist() if name.endswith("/traced_inputs.pkl")), None)
        if entry is None:
            raise ValueError("this TorchScript file records no example inputs (it was scripted, not traced): "
                             "save it with torch.jit.trace(model, example_inputs).save(...) or upload a torch.export .pt2")
        traced = _TracedInputsUnpickler(io.BytesIO(archive.read(entry))).load()
    examples = traced.get("forward") or []
    names = [value.debugName().split(".")[0] for value in list(module.graph.inputs())[1:]]
    if len(names) != len(examples):
        raise ValueError(f"the traced inputs ({len(examples)}) do not match forward's {len(names)} arguments")
    return [{"name": name, "dtype": example["dtype"], "shape": example["shape"]} for name, example in zip(names, examples, strict=True)]


def example_inputs(specs: list[dict], *, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs of the signature's shapes (symbolic dimensions as 1)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for spec in specs:
        shape = [d if isinstance(d, int) else 1 for d in spec["shape"]]
        dtype = np.dtype(spec["dtype"])
        arrays[spec["name"]] = rng.standard_normal(shape).astype(dtype) if dtype.kind == "f" else np.zeros(shape, dtype=dtype)
    return arrays


def _flat_outputs(result) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, dict):
        return [t for value in result.values() for t in _flat_outputs(value)]
    if isinstance(result, list | tuple):
        return [t for value in result for t in _flat_outputs(value)]
    raise ValueError(f"the model returns {type(result).__name__}; only tensors (or tuples, lists, dicts of them) are supported")


def run_torch(model: LoadedModel, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    args = tuple(torch.from_numpy(np.ascontiguousarray(feeds[spec["name"]])) for spec in model.inputs)
    with torch.no_grad():
        return [t.detach().cpu().numpy() for t in _flat_outputs(model.module(*args))]


def export_onnx(model: LoadedModel, onnx_path: Path) -> dict:
    """Write the ONNX file; returns which exporter made it and why the first one was not used."""
    feeds = example_inputs(model.inputs)
    count = len(run_torch(model, feeds))
    input_names = [spec["name"] for spec in model.inputs]
    output_names = ["output"] if count == 1 else [f"output_{i}" for i in range(count)]
    args = tuple(torch.from_numpy(feeds[name]) for name in input_names)
    try:
        target = model.program if model.program is not None else model.module
        torch.onnx.export(target, args if model.program is None else (), str(onnx_path), dynamo=True, input_names=input_names,
                          output_names=output_names, opset_version=OPSET, external_data=False, verbose=False)
        return {"exporter": "dynamo", "fallback_reason": None, "input_names": input_names, "output_names": output_names}
    except Exception as error:
        reason = _first_line(error)
    for leftover in onnx_path.parent.glob(onnx_path.name + "*"):
        leftover.unlink()
    torch.onnx.export(model.module, args, str(onnx_path), dynamo=False, input_names=input_names, output_names=output_names, opset_version=17)
    return {"exporter": "torchscript", "fallback_reason": reason, "input_names": input_names, "output_names": output_names}


def _first_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    if error.__cause__ is not None:
        text = f"{type(error.__cause__).__name__}: {error.__cause__}\n{text}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    cleaned = " ".join(lines[:2])
    for code in ("\x1b[96m", "\x1b[0m", "\x1b[1m", "\x1b[91m", "\x1b[93m"):
        cleaned = cleaned.replace(code, "")
    return cleaned[:500]


def parity(model: LoadedModel, onnx_path: Path, batches: list[dict[str, np.ndarray]]) -> dict:
    """Cosine and max abs error per output over the batches; passed when every cosine >= 1 - 1e-4."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    expected: dict[str, list] = {name: [] for name in names}
    actual: dict[str, list] = {name: [] for name in names}
    onnx_inputs = {i.name for i in session.get_inputs()}
    for feeds in batches:
        torch_outputs = run_torch(model, feeds)
        onnx_outputs = session.run(names, {k: v for k, v in feeds.items() if k in onnx_inputs})
        if len(torch_outputs) != len(onnx_outputs):
            raise ValueError(f"PyTorch gives {len(torch_outputs)} outputs, the ONNX model {len(onnx_outputs)}")
        for name, want, got in zip(names, torch_outputs, onnx_outputs, strict=True):
            expected[name].append(np.asarray(want, dtype=np.float64).ravel())
            actual[name].append(np.asarray(got, dtype=np.float64).ravel())
    outputs = []
    for name in names:
        want, got = np.concatenate(expected[name]), np.concatenate(actual[name])
        if want.shape != got.shape:
            outputs.append({"name": name, "cosine": 0.0, "max_abs_error": None, "error": f"{want.size} values from PyTorch, {got.size} from ONNX"})
            continue
        outputs.append({"name": name, "cosine": cosine_similarity(got, want), "max_abs_error": max_abs_error(got, want)})
    min_cosine = min((o["cosine"] for o in outputs), default=1.0)
    return {"outputs": outputs, "min_cosine": min_cosine, "threshold": PARITY_MIN_COSINE, "passed": min_cosine >= PARITY_MIN_COSINE,
            "samples": sum(len(next(iter(b.values()))) for b in batches) if batches else 0}


def dataset_batches(specs: list[dict], npz_path: Path, *, max_samples: int) -> list[dict[str, np.ndarray]]:
    """Up to max_samples rows of a dataset, cut to the model's static batch size (padded) or one batch."""
    with np.load(npz_path, allow_pickle=False) as archive:
        arrays = {spec["name"]: archive[spec["name"]][:max_samples] for spec in specs}
    rows = len(next(iter(arrays.values())))
    static = next((spec["shape"][0] for spec in specs if spec["shape"] and isinstance(spec["shape"][0], int)), None)
    if not static:
        return [arrays]
    batches = []
    for start in range(0, rows, static):
        batch = {}
        for name, value in arrays.items():
            part = value[start:start + static]
            missing = static - len(part)
            batch[name] = np.concatenate([part, np.repeat(part[-1:], missing, axis=0)]) if missing else part
        batches.append(batch)
    return batches
