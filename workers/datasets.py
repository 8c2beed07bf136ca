"""Read and check `.npz` datasets (one array per model input, first axis = samples, optional `labels`).

Arrays are read from the archive as streams of whole samples, never as whole arrays, so memory
stays bounded by one batch (or one scan block) however big the file is. The exception is an
array stored in Fortran order, whose samples are not contiguous on disk: that one array is
loaded whole. Compressed (`savez_compressed`) files stream the same way, just slower.
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

LABELS = "labels"
# Numeric dtypes a model input (or labels) can have; anything else is refused from the header.
ALLOWED_DTYPES = frozenset(
    np.dtype(name) for name in (
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64",
    )
)
# Bytes scanned at a time when looking for NaN/Inf; bounds the memory of inspect_npz.
_SCAN_BLOCK_BYTES = 16 << 20


class InvalidDataset(ValueError):
    """The file is not a usable dataset; the message says what is wrong and where."""


@dataclass(frozen=True)
class _ArrayHeader:
    name: str
    member: str
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool

    @property
    def row_bytes(self) -> int:
        return math.prod(self.shape[1:]) * self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def inspect_npz(path: str | Path, *, display_name: str | None = None, max_bytes: int | None = None) -> dict[str, Any]:
    """Describe a dataset (`samples`, `arrays` with dtype and shape, `has_labels`) after checking it.

    Every header is checked before any data is read: dimensions, dtype, the declared size
    against the stored member, and the total against `max_bytes`. Messages call the file
    `display_name` (the user's own name for it), never the server's path.
    """
    path = Path(path)
    label = display_name or path.name
    with _open_npz(path, label) as npz:
        headers = _read_headers(npz, label)
        _check_total_bytes(headers, max_bytes)
        samples = _sample_count(headers)
        for header in headers.values():
            _check_finite(npz, header)
    return {
        "samples": samples,
        "arrays": {
            name: {"dtype": header.dtype.name, "shape": list(header.shape)} for name, header in headers.items()
        },
        "has_labels": LABELS in headers,
    }


def check_dataset_against_signature(dataset_info: dict[str, Any], signature: dict[str, Any]) -> list[str]:
    """List, in words, every way a dataset does not fit a model signature (empty when it fits).

    The first axis of each array is the sample axis and stands for the model's batch dimension,
    so it is never compared; symbolic model dimensions accept any size.
    """
    problems: list[str] = []
    arrays = dataset_info.get("arrays", {})
    inputs = {spec["name"]: spec for spec in signature.get("inputs", [])}
    for name, spec in inputs.items():
        if name not in arrays:
            problems.append(f"missing array for model input {name!r} ({spec['dtype']} {_format_shape(spec.get('shape'))})")
            continue
        problems.extend(_array_problems(name, arrays[name], spec))
    for name in arrays:
        if name not in inputs and name != LABELS:
            expected = ", ".join(repr(n) for n in inputs) or "none"
            problems.append(f"array {name!r} matches no model input (model inputs: {expected})")
    return problems


def iter_batches(
    path: str | Path, *, input_names: list[str] | tuple[str, ...], batch_size: int, limit: int | None = None
) -> Iterator[dict[str, np.ndarray]]:
    """Yield `{input name: array}` batches of up to `batch_size` samples (at most `limit` samples in all)."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    path = Path(path)
    with _open_npz(path, path.name) as npz:
        headers = _read_headers(npz, path.name)
        missing = [name for name in input_names if name not in headers]
        if missing:
            raise InvalidDataset(f"{path.name} has no array named {', '.join(map(repr, missing))}")
        samples = _sample_count({name: headers[name] for name in input_names})
        if limit is not None:
            samples = min(samples, limit)
        readers = {name: _iter_rows(npz, headers[name], batch_size, samples) for name in input_names}
        for _ in range(math.ceil(samples / batch_size)):
            yield {name: next(reader) for name, reader in readers.items()}


def dataset_samples(path: str | Path) -> int:
    """Return the number of samples in a dataset from its headers alone (no data is read)."""
    path = Path(path)
    with _open_npz(path, path.name) as npz:
        return _sample_count(_read_headers(npz, path.name))


HOW_TO_SAVE = "save one with numpy.savez(path, input_name=array, ...)"


def _open_npz(path: Path, label: str):
    if not path.is_file():
        raise InvalidDataset(f"{label}: no such file")
    try:
        # Pickles are code execution; a dataset never needs them.
        loaded = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        # numpy's own message names the server's temp file and suggests allow_pickle: neither helps.
        raise InvalidDataset(f"{label} is not an .npz archive of numeric arrays; {HOW_TO_SAVE}") from error
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise InvalidDataset(f"{label} holds a single array (.npy), not an .npz archive of named arrays; {HOW_TO_SAVE}")
    return loaded


def _read_headers(npz: np.lib.npyio.NpzFile, label: str) -> dict[str, _ArrayHeader]:
    members = [member for member in npz.zip.namelist() if member.endswith(".npy")]
    if not members:
        raise InvalidDataset(f"{label} holds no arrays; {HOW_TO_SAVE}")
    headers = {}
    for member in members:
        name = member[: -len(".npy")]
        try:
            with npz.zip.open(member) as stream:
                shape, fortran_order, dtype = _read_npy_header(stream)
                header_bytes = stream.tell()
        except (ValueError, EOFError, zipfile.BadZipFile) as error:
            raise InvalidDataset(f"array {name!r} in {label} is unreadable: {error}") from error
        header = _ArrayHeader(name, member, tuple(shape), np.dtype(dtype), bool(fortran_order))
        _check_header(header, stored_bytes=npz.zip.getinfo(member).file_size - header_bytes)
        headers[name] = header
    return headers


def _check_header(header: _ArrayHeader, *, stored_bytes: int) -> None:
    """Refuse a header that lies about its data before anything trusts it for a read or an allocation."""
    name = header.name
    if header.dtype.hasobject:
        raise InvalidDataset(f"array {name!r} holds Python objects (dtype object); only numeric arrays are accepted")
    if header.dtype.newbyteorder("=") not in ALLOWED_DTYPES:
        allowed = ", ".join(sorted(dtype.name for dtype in ALLOWED_DTYPES))
        raise InvalidDataset(f"array {name!r} has dtype {header.dtype.str}; use one of {allowed}")
    if not header.shape:
        raise InvalidDataset(f"array {name!r} is a scalar; every array needs a first axis of samples")
    if any(type(dim) is not int or dim < 0 for dim in header.shape):
        raise InvalidDataset(f"array {name!r} declares an impossible shape {list(header.shape)}: dimensions are counts, 0 or more")
    declared = header.nbytes
    if declared != stored_bytes:
        raise InvalidDataset(
            f"array {name!r} declares shape {list(header.shape)} of {header.dtype.name} ({declared} bytes) "
            f"but holds {stored_bytes} bytes of data"
        )


def _check_total_bytes(headers: dict[str, _ArrayHeader], max_bytes: int | None) -> None:
    total = sum(header.nbytes for header in headers.values())
    if max_bytes is not None and total > max_bytes:
        raise InvalidDataset(f"the arrays hold {total / 1024**2:.0f} MB in all, over this server's limit of {max_bytes / 1024**2:.0f} MB (KILN_MAX_DATASET_BYTES)")


def _read_npy_header(stream) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(stream)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(stream)
    raise ValueError(f"unsupported .npy format version {version}")


def _sample_count(headers: dict[str, _ArrayHeader]) -> int:
    lengths = {name: header.shape[0] for name, header in headers.items()}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{name}: {length}" for name, length in lengths.items())
        raise InvalidDataset(f"arrays disagree on the number of samples (first axis): {listed}")
    samples = next(iter(lengths.values()))
    if samples == 0:
        raise InvalidDataset("the dataset has zero samples")
    return samples


def _check_finite(npz: np.lib.npyio.NpzFile, header: _ArrayHeader) -> None:
    if header.dtype.kind not in "fc":
        return
    rows_per_block = max(1, _SCAN_BLOCK_BYTES // max(header.row_bytes, 1))
    start = 0
    for block in _iter_rows(npz, header, rows_per_block, header.shape[0]):
        finite = np.isfinite(block).reshape(len(block), -1).all(axis=1)
        if not finite.all():
            first_bad = start + int(np.argmin(finite))
            raise InvalidDataset(f"array {header.name!r} contains NaN or Inf (first at sample {first_bad})")
        start += len(block)


def _iter_rows(npz: np.lib.npyio.NpzFile, header: _ArrayHeader, rows: int, samples: int) -> Iterator[np.ndarray]:
    """Yield consecutive blocks of `rows` samples, reading only those bytes from the archive."""
    if header.fortran_order:
        # Samples are strided across the whole array on disk; no way to stream them.
        whole = npz[header.name]
        native = header.dtype.newbyteorder("=")
        for start in range(0, samples, rows):
            yield np.ascontiguousarray(whole[start : min(start + rows, samples)], dtype=native)
        return
    with npz.zip.open(header.member) as stream:
        _read_npy_header(stream)
        for start in range(0, samples, rows):
            count = min(rows, samples - start)
            buffer = _read_exact(stream, count * header.row_bytes, header.name)
            block = np.frombuffer(buffer, dtype=header.dtype).reshape((count, *header.shape[1:]))
            # Runtimes read raw memory: hand them native byte order whatever the file used.
            yield block.astype(header.dtype.newbyteorder("="), copy=False)


def _read_exact(stream, size: int, name: str) -> bytearray:
    buffer = bytearray(size)
    view = memoryview(buffer)
    filled = 0
    while filled < size:
        got = stream.readinto(view[filled:])
        if not got:
            raise InvalidDataset(f"array {name!r} is truncated")
        filled += got
    return buffer


def _array_problems(name: str, array: dict[str, Any], spec: dict[str, Any]) -> list[str]:
    problems = []
    if array["dtype"] != spec["dtype"]:
        problems.append(f"array {name!r} is {array['dtype']} but the model input expects {spec['dtype']}")
    expected = spec.get("shape")
    if expected is None:
        return problems
    actual = array["shape"]
    if len(actual) != len(expected):
        problems.append(
            f"array {name!r} has shape {_format_shape(actual)} (rank {len(actual)}) but the model input "
            f"expects rank {len(expected)} {_format_shape(expected)}"
        )
        return problems
    for axis, (have, want) in enumerate(zip(actual[1:], expected[1:]), start=1):
        if isinstance(want, int) and want > 0 and have != want:
            problems.append(
                f"array {name!r} has size {have} on axis {axis} but the model input expects {want} "
                f"(shape {_format_shape(expected)})"
            )
    return problems


def _format_shape(shape: list | None) -> str:
    if shape is None:
        return "[any shape]"
    return "[" + ", ".join(str(dim) for dim in shape) + "]"
