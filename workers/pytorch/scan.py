"""Static check of an uploaded PyTorch file before anything loads it: which kind it is, and what its pickles import.

Nothing here unpickles. Every pickle stream in the archive (and in archives nested in it) is walked
opcode by opcode with `pickletools.genops`; each GLOBAL / STACK_GLOBAL it would resolve must be on
an allow-list of tensor-rebuilding functions. A plain `torch.save` pickle (a state_dict or a whole
pickled module) is refused outright: loading one means running whatever its pickle names.
"""
from __future__ import annotations

import io
import json
import pickletools
import re
import zipfile
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
        names = _checked_names(archive, max_entries=max_entries, max_total_bytes=max_total_bytes)
        kind = _kind(names)
        facts = TorchFileFacts(kind=kind)
        _scan_archive(archive, facts, depth=0)
        _check_operators(archive, names, kind)
    return facts


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
    for name in sources:
        text = archive.read(name).decode("utf-8", errors="replace")
        for namespace in sorted(set(pattern.findall(text)) - ALLOWED_OP_NAMESPACES):
            raise RefusedTorchFile(
                f"The model calls operators of the {namespace!r} namespace ({_inner(name)}), which need custom code; "
                "only PyTorch's built-in operators can be loaded.",
                code="custom_code",
            )
        if kind == TORCHSCRIPT:
            _check_load_time_code(text, label=_inner(name))


SETSTATE = re.compile(r"^(?P<indent>[ \t]*)def __setstate__\(.*?(?=^(?P=indent)def |\Z)", re.MULTILINE | re.DOTALL)
SCRIPT_CALL = re.compile(r"\b(?:torch|ops\.(\w+))\.(\w+)\(")


def _check_load_time_code(text: str, *, label: str) -> None:
    """`__setstate__` runs while TorchScript loads the file, before the sandbox can read the loaded graph: check its calls here."""
    for body in SETSTATE.finditer(text):
        called = {f"{namespace or 'aten'}::{name}" for namespace, name in SCRIPT_CALL.findall(body.group(0))}
        try:
            operators.check(called, where=f"{label} (its __setstate__, which runs at load)")
        except operators.RefusedOperators as refused:
            raise RefusedTorchFile(str(refused), code=refused.code) from None
