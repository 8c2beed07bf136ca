"""Static check of an uploaded PyTorch file before anything loads it: which kind it is, and what its pickles import.

Nothing here unpickles. Every pickle stream in the archive (and in archives nested in it) is walked
opcode by opcode with `pickletools.genops`; each GLOBAL / STACK_GLOBAL it would resolve must be on
an allow-list of tensor-rebuilding functions. A plain `torch.save` pickle (a state_dict or a whole
pickled module) is refused outright: loading one means running whatever its pickle names.
"""
from __future__ import annotations

import ast
import io
import json
import pickletools
import re
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from . import operators

TORCH_EXPORT = "torch-export"
TORCHSCRIPT = "torchscript"

PICKLE_PROTOCOL_BYTE = 0x80
MAX_NESTING = 2

# What the rebuild of tensors and of TorchScript containers names. TorchScript's own `__torch__.*`
# classes are resolved by the TorchScript loader from the archive's compiled code, never imported.
ALLOWED_GLOBALS = frozenset({
    "collections.OrderedDict",
    "torch._utils._rebuild_tensor",
    "torch._utils._rebuild_tensor_v2",
    "torch._utils._rebuild_tensor_v3",
    "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_parameter_with_state",
    "torch._utils._rebuild_qtensor",
    "torch._utils._rebuild_sparse_tensor",
    "torch._tensor._rebuild_from_type_v2",
    "torch.Tensor",
    "torch.nn.parameter.Parameter",
    "torch.device",
    "torch.Size",
    "torch.storage.UntypedStorage",
    "torch.jit._pickle.restore_type_tag",
    "torch.jit._pickle.build_intlist",
    "torch.jit._pickle.build_doublelist",
    "torch.jit._pickle.build_boollist",
    "torch.jit._pickle.build_tensorlist",
    "torch.jit._pickle.build_tensor_from_id",
})
ALLOWED_TORCH_NAMES = re.compile(r"^torch\.(\w+Storage|float\d*|bfloat16|half|double|int\d*|uint\d*|bool|complex\d*|long|short|qint8|quint8|qint32|"
                                 r"per_tensor_affine|per_channel_affine|per_tensor_symmetric|per_channel_symmetric|per_channel_affine_float_qparams)$")
TORCHSCRIPT_CLASS = re.compile(r"^__torch__(\.[\w.]+)?\.\w+$")
# Operator namespaces a model may call without custom code (TorchScript code, torch.export graphs).
ALLOWED_OP_NAMESPACES = frozenset({"aten", "prim", "quantized", "_quantized", "higher_order"})
TORCHSCRIPT_OP = re.compile(r"\bops\.(\w+)\.")
EXPORT_TARGET = re.compile(r"torch\.ops\.(\w+)\.")

STRING_OPCODES = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}
PUT_OPCODES = {"PUT", "BINPUT", "LONG_BINPUT"}
GET_OPCODES = {"GET", "BINGET", "LONG_BINGET"}


class RefusedTorchFile(ValueError):
    """The upload is not something Kiln will load: the message says why and what to upload instead."""

    def __init__(self, message: str, *, code: str):
        super().__init__(message)
        self.code = code


@dataclass
class TorchFileFacts:
    kind: str
    pickles: list[str] = field(default_factory=list)
    globals: list[str] = field(default_factory=list)


def scan_torch_file(path, *, max_entries: int = 10_000, max_total_bytes: int = 8 << 30) -> TorchFileFacts:
    """Classify an uploaded .pt/.pt2 and check every pickle in it; raises RefusedTorchFile."""
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head[:1] == bytes([PICKLE_PROTOCOL_BYTE]):
        raise RefusedTorchFile(_PICKLE_REFUSAL.format(what="a plain pickle"), code="pickle_refused")
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError) as error:
        raise RefusedTorchFile(f"This is not a PyTorch archive (a torch.export .pt2 or a TorchScript .pt zip): {error}", code="unsupported_format") from None
    with archive:
        try:
            names = _checked_names(archive, max_entries=max_entries, max_total_bytes=max_total_bytes)
            kind = _kind(names)
            facts = TorchFileFacts(kind=kind)
            _scan_archive(archive, facts, depth=0)
            _check_operators(archive, names, kind)
        except RefusedTorchFile:
            raise
        except DAMAGED as error:  # a central directory that reads, entries that do not: the file's fault, a 400
            raise RefusedTorchFile(f"The archive is damaged (an entry cannot be read: {error}); save the model again.",
                                   code="invalid_model") from None
    return facts


# What reading a damaged zip's entries raises: a bad header or CRC, a bad offset, a name that does not decode,
# a compression method or encryption zipfile does not read, a broken deflate stream.
DAMAGED = (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError, RuntimeError, zlib.error)


_PICKLE_REFUSAL = (
    "This is {what} (torch.save of a state_dict or of a whole module). Kiln never unpickles uploads, "
    "because unpickling runs whatever code the file names. Upload a torch.export archive "
    "(torch.export.save(torch.export.export(model, example_inputs), 'model.pt2')) or a traced "
    "TorchScript file (torch.jit.trace(model, example_inputs).save('model.pt'))."
)


def _checked_names(archive: zipfile.ZipFile, *, max_entries: int, max_total_bytes: int) -> list[str]:
    infos = archive.infolist()
    if len(infos) > max_entries:
        raise RefusedTorchFile(f"The archive has {len(infos)} entries; at most {max_entries} are allowed.", code="unsafe_archive")
    total = sum(info.file_size for info in infos)
    if total > max_total_bytes:
        raise RefusedTorchFile(f"The archive unpacks to {total:,} bytes; at most {max_total_bytes:,} are allowed.", code="unsafe_archive")
    for info in infos:
        parts = PurePosixPath(info.filename).parts
        if info.filename.startswith("/") or ".." in parts:
            raise RefusedTorchFile(f"Entry {info.filename!r} would escape the archive.", code="unsafe_archive")
    return [info.filename for info in infos]


def _inner(name: str) -> str:
    """An entry's name below the archive's single top folder (torch writes `<stem>/...`)."""
    parts = PurePosixPath(name).parts
    return "/".join(parts[1:]) if len(parts) > 1 else name


def _kind(names: list[str]) -> str:
    inner = {_inner(name) for name in names}
    if "archive_format" in inner or any(name.startswith("models/") and name.endswith(".json") for name in inner):
        return TORCH_EXPORT
    if "data.pkl" in inner and any(name.startswith("code/") for name in inner) and "constants.pkl" in inner:
        return TORCHSCRIPT
    if "data.pkl" in inner:
        raise RefusedTorchFile(_PICKLE_REFUSAL.format(what="a torch.save archive"), code="pickle_refused")
    raise RefusedTorchFile("This zip is neither a torch.export archive (.pt2) nor a TorchScript file (.pt).", code="unsupported_format")


def _scan_archive(archive: zipfile.ZipFile, facts: TorchFileFacts, *, depth: int) -> None:
    pickled = _pickled_entries(archive)
    for info in archive.infolist():
        if info.is_dir():
            continue
        if info.filename in pickled:
            for name in pickle_globals(archive.read(info), label=info.filename):
                _check_global(name, label=info.filename, kind=facts.kind)
                if name not in facts.globals:
                    facts.globals.append(name)
            facts.pickles.append(info.filename)
            continue
        with archive.open(info) as handle:
            head = handle.read(4)
        if head == b"PK\x03\x04":
            if depth >= MAX_NESTING:
                raise RefusedTorchFile(f"Entry {info.filename!r} nests archives too deeply.", code="unsafe_archive")
            try:
                nested = zipfile.ZipFile(io.BytesIO(archive.read(info)))
            except zipfile.BadZipFile:
                continue  # raw tensor bytes that happen to start like a zip
            with nested:
                _scan_archive(nested, facts, depth=depth + 1)


def _pickled_entries(archive: zipfile.ZipFile) -> set[str]:
    """Entries a loader unpickles: `*.pkl`, and torch.export weights or constants its configs mark `use_pickle`."""
    names = archive.namelist()
    pickled = {name for name in names if name.endswith(".pkl")}
    for config_name in (name for name in names if name.endswith("_config.json")):
        try:
            config = json.loads(archive.read(config_name)).get("config", {})
        except (ValueError, AttributeError):
            raise RefusedTorchFile(f"{config_name} is not readable JSON.", code="invalid_model") from None
        folder = config_name.rsplit("/", 1)[0]
        for entry in config.values() if isinstance(config, dict) else []:
            if isinstance(entry, dict) and entry.get("use_pickle"):
                pickled.add(f"{folder}/{entry.get('path_name', '')}")
    return pickled


def pickle_globals(data: bytes, *, label: str = "pickle") -> list[str]:
    """The `module.name` of every global a pickle stream would import, found without executing it."""
    found: list[str] = []
    recent: list[object] = []  # what the last opcodes pushed, strings only (None for anything else)
    memo: dict[int, object] = {}
    try:
        for opcode, argument, _ in pickletools.genops(data):
            name = opcode.name
            if name == "GLOBAL" or name == "INST":
                module, _, attribute = str(argument).partition(" ")
                found.append(f"{module}.{attribute}")
                recent.append(None)
            elif name == "STACK_GLOBAL":
                module, attribute = (recent[-2], recent[-1]) if len(recent) >= 2 else (None, None)
                if not isinstance(module, str) or not isinstance(attribute, str):
                    raise RefusedTorchFile(f"{label}: an import whose name is computed at load time; refused.", code="forbidden_import")
                found.append(f"{module}.{attribute}")
                recent.append(None)
            elif name in STRING_OPCODES:
                recent.append(argument if isinstance(argument, str) else argument.decode("latin-1") if isinstance(argument, bytes) else None)
            elif name in PUT_OPCODES:
                memo[int(argument)] = recent[-1] if recent else None
            elif name == "MEMOIZE":
                memo[len(memo)] = recent[-1] if recent else None
            elif name in GET_OPCODES:
                recent.append(memo.get(int(argument)))
            else:
                recent.append(None)
            del recent[:-4]
    except RefusedTorchFile:
        raise
    except Exception as error:
        raise RefusedTorchFile(f"{label} is not a readable pickle stream: {error}", code="invalid_model") from None
    return found


def _check_global(name: str, *, label: str, kind: str) -> None:
    if name in ALLOWED_GLOBALS or ALLOWED_TORCH_NAMES.match(name):
        return
    if kind == TORCHSCRIPT and TORCHSCRIPT_CLASS.match(name):
        return
    raise RefusedTorchFile(
        f"{label} imports {name!r}, which is not a tensor or container type; loading it could run code, so the file is refused.",
        code="forbidden_import",
    )


def _check_operators(archive: zipfile.ZipFile, names: list[str], kind: str) -> None:
    """Operators from namespaces outside PyTorch's own need custom code Kiln will not load."""
    if kind == TORCHSCRIPT:
        sources = [name for name in names if _inner(name).startswith("code/") and name.endswith(".py")]
        pattern = TORCHSCRIPT_OP
    else:
        sources = [name for name in names if _inner(name).startswith("models/") and name.endswith(".json")]
        pattern = EXPORT_TARGET
    texts = {name: archive.read(name).decode("utf-8", errors="replace") for name in sources}
    for name, text in texts.items():
        for namespace in sorted(set(pattern.findall(text)) - ALLOWED_OP_NAMESPACES):
            raise RefusedTorchFile(
                f"The model calls operators of the {namespace!r} namespace ({_inner(name)}), which need custom code; "
                "only PyTorch's built-in operators can be loaded.",
                code="custom_code",
            )
    if kind == TORCHSCRIPT:
        check_load_time_code({_inner(name): text for name, text in texts.items()})
    else:
        for name, text in texts.items():
            _check_export_targets(text, label=_inner(name))


# What a torch.export graph may call besides `torch.ops.*` operators: Python's arithmetic on sizes.
EXPORT_PYTHON_TARGET = re.compile(r"^(?:_operator|operator|math)\.\w+$|^torch\.(?:_?sym_\w+)$")


def _node_targets(value) -> Iterator[str]:
    """Every node `target` of a serialized torch.export program, nested graphs (cond, loops) included."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            if isinstance(item.get("target"), str) and "inputs" in item:
                yield item["target"]
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)


def _check_export_targets(text: str, *, label: str) -> None:
    """A node whose target is a Python function (torch.load, builtins.exec) would have it called: refused by name here,
    before the deserializer (whose own refusal names it by memory address)."""
    try:
        program = json.loads(text)
    except ValueError:
        raise RefusedTorchFile(f"{label} is not readable JSON.", code="invalid_model") from None
    for target in sorted(set(_node_targets(program))):
        if target.startswith("torch.ops.") or EXPORT_PYTHON_TARGET.match(target):
            continue
        raise RefusedTorchFile(f"The model calls {target} ({label}), which is not a PyTorch operator: a torch.export graph may "
                               "call only operators, so the file is refused.", code="forbidden_operator")


# -- code that runs while a TorchScript file loads ------------------------------------------

# Calls TorchScript's printer writes that are the language itself, not operators or the archive's code.
SCRIPT_BUILTINS = frozenset({"getattr", "hasattr", "uninitialized", "annotate", "unchecked_cast", "isinstance", "len", "int",
                             "float", "bool", "str", "range", "enumerate", "zip", "min", "max", "abs", "round", "list", "dict",
                             "tuple", "print", "divmod", "ord", "chr", "hash", "sorted", "all", "any", "sum"})


@dataclass
class _Function:
    """One function of the archive's TorchScript code: a class's method (with the name its receiver has) or a free function."""

    qualified: str
    node: ast.FunctionDef
    receiver: str | None = None
    owner: str | None = None


@dataclass
class _Program:
    """The archive's TorchScript code: classes by qualified name (their methods by name) and free functions."""

    classes: dict[str, dict[str, _Function]] = field(default_factory=dict)
    functions: dict[str, _Function] = field(default_factory=dict)

    def methods_named(self, name: str) -> list[_Function]:
        return [methods[name] for methods in self.classes.values() if name in methods]


def _module_name(label: str) -> str:
    """`code/__torch__/torch/nn/modules/linear.py` -> `__torch__.torch.nn.modules.linear`."""
    return ".".join(PurePosixPath(label).with_suffix("").parts[1:])


def _program(sources: dict[str, str]) -> _Program:
    program = _Program()
    for label, text in sources.items():
        module = _module_name(label)
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            raise RefusedTorchFile(f"The TorchScript code in {label} could not be read, so what it runs while loading cannot be "
                                   "checked; the file is refused.", code="load_time_code") from None
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                qualified = f"{module}.{node.name}"
                program.classes[qualified] = {
                    item.name: _Function(f"{qualified}.{item.name}", item, item.args.args[0].arg if item.args.args else None, qualified)
                    for item in node.body if isinstance(item, ast.FunctionDef)}
            elif isinstance(node, ast.FunctionDef):
                program.functions[f"{module}.{node.name}"] = _Function(f"{module}.{node.name}", node)
    return program


def _dotted(node: ast.expr) -> str | None:
    """`a.b.c` as text, or None when the expression is not a plain dotted name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _callees(program: _Program, function: _Function, operators_called: set[str]) -> tuple[list[_Function], list[str]]:
    """What one function calls: the archive's functions it may reach (every candidate when the receiver's class is not
    known), the operators (added to `operators_called`), and the calls that cannot be followed."""
    reached: list[_Function] = []
    unknown: list[str] = []
    for node in ast.walk(function.node):
        if not isinstance(node, ast.Call):
            continue
        target = node.func
        dotted = _dotted(target)
        if dotted and dotted.startswith("torch.") and dotted.count(".") == 1:
            operators_called.add(f"aten::{dotted.split('.')[1]}")
        elif dotted and dotted.startswith("ops.") and dotted.count(".") == 2:
            _, namespace, name = dotted.split(".")
            operators_called.add(f"{namespace}::{name}")
        elif dotted and dotted.startswith("__torch__."):
            if dotted in program.functions:
                reached.append(program.functions[dotted])
            elif dotted in program.classes and "__init__" in program.classes[dotted]:
                reached.append(program.classes[dotted]["__init__"])
            elif dotted not in program.classes:
                unknown.append(dotted)
        elif isinstance(target, ast.Name):
            if target.id not in SCRIPT_BUILTINS:
                unknown.append(target.id)
        elif isinstance(target, ast.Attribute):
            receiver = target.value
            own = function.owner and isinstance(receiver, ast.Name) and receiver.id == function.receiver
            candidates = ([program.classes[function.owner][target.attr]] if own and target.attr in program.classes[function.owner]
                          else program.methods_named(target.attr))
            # A method no class of the archive defines is a built-in type's (a list's append, a packed weight's unpack).
            reached.extend(candidates)
        else:
            unknown.append(ast.unparse(target))
    return reached, unknown


def _load_time_reach(program: _Program, start: _Function) -> tuple[list[str], set[str], list[str]]:
    """Every function `start` may run (the names), every operator they call, and every call that cannot be followed."""
    seen: dict[str, _Function] = {}
    pending = [start]
    operators_called: set[str] = set()
    unknown: list[str] = []
    while pending:
        function = pending.pop()
        if function.qualified in seen:
            continue
        seen[function.qualified] = function
        reached, cannot = _callees(program, function, operators_called)
        pending.extend(reached)
        unknown += cannot
    return [name.removeprefix("__torch__.") for name in seen], operators_called, unknown


def check_load_time_code(sources: dict[str, str]) -> None:
    """`__setstate__` runs while TorchScript loads the file, before the sandbox can read the loaded graph: every method
    and function it may reach (calls on `self` followed within its class, other method calls to every method of that
    name in the archive) must call only allow-listed operators. `sources` maps `code/...py` labels to their text."""
    if not any("__setstate__" in text for text in sources.values()):
        return
    program = _program(sources)
    for methods in program.classes.values():
        if "__setstate__" not in methods:
            continue
        start = methods["__setstate__"]
        reached, operators_called, unknown = _load_time_reach(program, start)
        where = f"{start.qualified.removeprefix('__torch__.')} (run while the file loads"
        where += f", with {', '.join(name for name in reached[1:])})" if len(reached) > 1 else ")"
        if unknown:
            raise RefusedTorchFile(f"{where} calls {', '.join(sorted(set(unknown)))}, which Kiln cannot follow; load-time code it "
                                   "cannot check is refused. Trace the model without a custom __setstate__.", code="load_time_code")
        try:
            operators.check(operators_called, where=where)
        except operators.RefusedOperators as refused:
            raise RefusedTorchFile(str(refused), code=refused.code) from None


def _check_load_time_code(text: str, *, label: str) -> None:
    """One code file's load-time code, checked on its own (`check_load_time_code` checks an archive's files together)."""
    check_load_time_code({label: text})
