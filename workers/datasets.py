"""Read and check datasets: an `.npz` of named arrays (first axis = samples, optional `labels`), or a
zip of one `.npz` per sample whose shapes may differ (see kiln_contract/feeds.py for how either is fed).

Arrays are read from the archive as streams of whole samples, never as whole arrays, so memory
stays bounded by one batch (or one scan block) however big the file is. The exception is an
array stored in Fortran order, whose samples are not contiguous on disk: that one array is
loaded whole. Compressed (`savez_compressed`) files stream the same way, just slower.
"""

from __future__ import annotations

import io
import math
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kiln_contract import feeds, npzio
from kiln_contract.npzio import ArrayHeader as _ArrayHeader
from kiln_contract.recipes import AUDIO_SUFFIXES, IMAGE_SUFFIXES

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

    code = "invalid_dataset"


def inspect_npz(path: str | Path, *, display_name: str | None = None, max_bytes: int | None = None) -> dict[str, Any]:
    """Describe a dataset (`samples`, `arrays` with dtype and shape, `has_labels`) after checking it.

    Every header is checked before any data is read: dimensions, dtype, the declared size
    against the stored member, and the total against `max_bytes`. Messages call the file
    `display_name` (the user's own name for it), never the server's path.
    """
    path = Path(path)
    label = display_name or path.name
    with _open_npz(path, label) as npz:
        headers = _read_headers(npz.zip, label)
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


def check_dataset_against_signature(
    dataset_info: dict[str, Any], signature: dict[str, Any], *, state: dict[str, str] | None = None,
    initial_state: dict[str, Any] | None = None,
) -> list[str]:
    """List, in words, every way a dataset does not fit a model signature (empty when it fits).

    Each array's layout is told by its rank against the model input's (batch-first, stacked
    feeds, or sequences of feeds; kiln_contract/feeds.py); symbolic model dimensions accept any size.
    """
    return feeds.plan_problems(dataset_info, signature, state=state, initial_state=initial_state)[1]


def dataset_plan(
    dataset_info: dict[str, Any], signature: dict[str, Any], *, state: dict[str, str] | None = None,
    initial_state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """How the dataset is fed to the model (feeds.resolve_plan); raises InvalidDataset when it does not fit."""
    plan, problems = feeds.plan_problems(dataset_info, signature, state=state, initial_state=initial_state)
    if problems:
        raise InvalidDataset("; ".join(problems))
    return plan


def inspect_dataset(path: str | Path, *, display_name: str | None = None, max_bytes: int | None = None) -> dict[str, Any]:
    """Describe either kind of dataset file (`format` says which) after checking it."""
    path = Path(path)
    label = display_name or path.name
    try:
        kind = feeds.file_format(path)
    except feeds.FeedError:
        kind = feeds.NPZ  # inspect_npz words the refusal
    if kind == feeds.SAMPLES:
        return inspect_samples(path, display_name=label, max_bytes=max_bytes)
    return {**inspect_npz(path, display_name=label, max_bytes=max_bytes), "format": feeds.NPZ}


MAX_SAMPLE_FILES = 100_000


def inspect_samples(path: str | Path, *, display_name: str | None = None, max_bytes: int | None = None) -> dict[str, Any]:
    """Describe a zip of one `.npz` per sample: every sample holds the same names, dtypes and ranks;
    a dimension that differs between samples is reported as None."""
    path = Path(path)
    label = display_name or path.name
    with zipfile.ZipFile(path) as archive:
        members = sorted(name for name in archive.namelist() if name.endswith(".npz"))
        if len(members) > MAX_SAMPLE_FILES:
            raise InvalidDataset(f"{label} holds {len(members)} samples, over the limit of {MAX_SAMPLE_FILES}")
        stored = sum(archive.getinfo(member).file_size for member in members)
        if max_bytes is not None and stored > max_bytes:
            raise InvalidDataset(f"the samples hold {stored / 1024**2:.0f} MB in all, over this server's limit of "
                                 f"{max_bytes / 1024**2:.0f} MB (KILN_MAX_DATASET_BYTES)")
        arrays: dict[str, dict[str, Any]] = {}
        declared = 0
        for member in members:
            # Each sample's headers are checked (and their sizes added up) before its arrays are read.
            declared += sum(header.nbytes for header in _nested_headers(archive, member, label).values())
            if max_bytes is not None and declared > max_bytes:
                raise InvalidDataset(f"the samples' arrays declare {_size_text(declared)} by sample {member!r}, over this server's "
                                     f"limit of {_size_text(max_bytes)} (KILN_MAX_DATASET_BYTES)")
            _merge_sample(arrays, member, _sample_headers(archive, member, label))
    if not members:
        raise InvalidDataset(f"{label} holds no samples")
    return {
        "samples": len(members),
        "arrays": {name: {"dtype": entry["dtype"], "shape": [len(members), *entry["shape"]]} for name, entry in arrays.items()},
        "has_labels": LABELS in arrays,
        "format": feeds.SAMPLES,
    }


def _size_text(count: int) -> str:
    return f"{count / 1024**2:,.0f} MB" if count >= 10 * 1024**2 else f"{count:,} bytes"


def _nested_headers(archive: zipfile.ZipFile, member: str, label: str) -> dict[str, _ArrayHeader]:
    """The checked `.npy` headers of one per-sample `.npz` inside the zip, read without its data."""
    try:
        with archive.open(member) as stream, zipfile.ZipFile(stream) as sample:
            return _read_headers(sample, f"sample {member!r} of {label}", sample_axis=False)
    except InvalidDataset as error:
        raise InvalidDataset(f"sample {member!r}: {error}") from None
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise InvalidDataset(f"sample {member!r} of {label} is not an .npz of numeric arrays ({error})") from error


def _sample_headers(archive: zipfile.ZipFile, member: str, label: str) -> dict[str, np.ndarray]:
    try:
        sample = feeds.load_sample(archive, member)
    except feeds.FeedError as error:
        raise InvalidDataset(f"{label}: {error}") from error
    for name, array in sample.items():
        where = f"array {name!r} of sample {member!r}"
        if array.dtype.hasobject or array.dtype.newbyteorder("=") not in ALLOWED_DTYPES:
            raise InvalidDataset(f"{where} has dtype {array.dtype.str}; only numeric arrays are accepted")
        if array.dtype.kind in "fc" and not np.isfinite(array).all():
            raise InvalidDataset(f"{where} contains NaN or Inf")
    return sample


def _merge_sample(arrays: dict[str, dict[str, Any]], member: str, sample: dict[str, np.ndarray]) -> None:
    if arrays and set(sample) != set(arrays):
        raise InvalidDataset(f"sample {member!r} holds {sorted(sample)} but earlier samples hold {sorted(arrays)}")
    for name, array in sample.items():
        entry = arrays.get(name)
        if entry is None:
            arrays[name] = {"dtype": array.dtype.newbyteorder("=").name, "shape": list(array.shape)}
            continue
        if array.dtype.newbyteorder("=").name != entry["dtype"] or array.ndim != len(entry["shape"]):
            raise InvalidDataset(f"array {name!r} of sample {member!r} is {array.dtype.name} rank {array.ndim}; "
                                 f"earlier samples are {entry['dtype']} rank {len(entry['shape'])}")
        entry["shape"] = [have if have == now else None for have, now in zip(entry["shape"], array.shape)]


def iter_batches(
    path: str | Path, *, input_names: list[str] | tuple[str, ...], batch_size: int, limit: int | None = None
) -> Iterator[dict[str, np.ndarray]]:
    """Yield `{input name: array}` batches of up to `batch_size` samples (at most `limit` samples in all)."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    path = Path(path)
    if _is_samples(path):
        # A zip of samples holds exactly the tensors of one call each (the pipeline writes calibration
        # calls this way): they are never batched together.
        try:
            for row in feeds.iter_rows(path, list(input_names), limit=limit):
                yield Call(row)
        except feeds.FeedError as error:
            raise InvalidDataset(str(error)) from error
        return
    with _open_npz(path, path.name) as npz:
        headers = _read_headers(npz.zip, path.name)
        missing = [name for name in input_names if name not in headers]
        if missing:
            raise InvalidDataset(f"{path.name} has no array named {', '.join(map(repr, missing))}")
        samples = _sample_count({name: headers[name] for name in input_names})
        if limit is not None:
            samples = min(samples, limit)
        readers = {name: _iter_rows(npz, headers[name], batch_size, samples) for name in input_names}
        for _ in range(math.ceil(samples / batch_size)):
            yield {name: next(reader) for name, reader in readers.items()}


class Call(dict):
    """The exact feeds of one call (a scalar or a batch-on-axis-1 input has no row count of its own)."""


def batch_rows(batch: dict[str, np.ndarray]) -> int:
    """How many samples a batch from iter_batches holds: one for a call, else the first axis."""
    if isinstance(batch, Call):
        return 1
    return len(next(iter(batch.values())))


def dataset_samples(path: str | Path) -> int:
    """Return the number of samples in a dataset from its headers alone (no data is read)."""
    path = Path(path)
    if _is_samples(path):
        return feeds.sample_count(path)
    with _open_npz(path, path.name) as npz:
        return _sample_count(_read_headers(npz.zip, path.name))


def _is_samples(path: Path) -> bool:
    try:
        return feeds.file_format(path) == feeds.SAMPLES
    except feeds.FeedError:
        return False


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


def _raw_files_message(names: list[str], label: str) -> str | None:
    """A zip of images or recordings is raw data: say how it becomes a dataset, not how to write arrays."""
    for kind, suffixes in (("images", IMAGE_SUFFIXES), ("WAV files", AUDIO_SUFFIXES)):
        count = sum(1 for name in names if name.lower().endswith(suffixes))
        if count:
            return (f"{label} holds {count} {kind} and no arrays: raw data needs a recipe that says how each file becomes the model's input. "
                    "On the Datasets page choose the model to get one proposed (with a preview), "
                    "or run `kiln datasets upload FILE --kind … --for-model MODEL`.")
    return None


def _read_headers(archive: zipfile.ZipFile, label: str, *, sample_axis: bool = True) -> dict[str, _ArrayHeader]:
    """Every `.npy` header of an `.npz` archive, checked (see _check_header); no data is read."""
    members = [member for member in archive.namelist() if member.endswith(".npy")]
    if not members:
        raise InvalidDataset(_raw_files_message(archive.namelist(), label) or f"{label} holds no arrays; {HOW_TO_SAVE}")
    headers = {}
    for member in members:
        name = member[: -len(".npy")]
        try:
            header, header_bytes = npzio.read_header(archive, member)
        except (ValueError, EOFError, zipfile.BadZipFile) as error:
            raise InvalidDataset(f"array {name!r} in {label} is unreadable: {error}") from error
        _check_header(header, stored_bytes=archive.getinfo(member).file_size - header_bytes, sample_axis=sample_axis)
        headers[name] = header
    return headers


def _check_header(header: _ArrayHeader, *, stored_bytes: int, sample_axis: bool = True) -> None:
    """Refuse a header that lies about its data before anything trusts it for a read or an allocation.

    `sample_axis`: the array stacks samples on its first axis (an `.npz` of the whole set), so it
    cannot be a scalar; a per-sample `.npz` may hold scalars."""
    name = header.name
    if header.dtype.hasobject:
        raise InvalidDataset(f"array {name!r} holds Python objects (dtype object); only numeric arrays are accepted")
    if header.dtype.newbyteorder("=") not in ALLOWED_DTYPES:
        allowed = ", ".join(sorted(dtype.name for dtype in ALLOWED_DTYPES))
        raise InvalidDataset(f"array {name!r} has dtype {header.dtype.str}; use one of {allowed}")
    if sample_axis and not header.shape:
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
    try:
        yield from npzio.iter_rows(npz.zip, header, rows, samples)
    except ValueError as error:
        raise InvalidDataset(str(error)) from error


def hdf5_to_samples(path: str | Path, out_path: str | Path, *, display_name: str, max_bytes: int | None = None) -> int:
    """Write an HDF5 file of one group per sample (datasets named like the model inputs) as a zip of
    one `.npz` per sample; returns the sample count.

    Links and storage that point outside the file (external links, external or virtual datasets)
    are refused: they would read other files of the server.
    """
    import h5py

    try:
        source = h5py.File(path, "r")
    except OSError as error:
        raise InvalidDataset(f"{display_name} is not an HDF5 file") from error
    try:
        with source, zipfile.ZipFile(out_path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            written = _hdf5_write_samples(source, archive, display_name=display_name, max_bytes=max_bytes)
    except InvalidDataset:
        raise
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as error:
        # HDF5's own refusals: a filter it lacks, a corrupt chunk index, an unreadable name...
        raise InvalidDataset(f"{display_name} could not be read as HDF5 ({error})") from None
    if not written:
        raise InvalidDataset(f"{display_name} holds no samples")
    return written


def _hdf5_write_samples(source, archive: zipfile.ZipFile, *, display_name: str, max_bytes: int | None) -> int:
    import h5py

    names = sorted(source.keys())
    if len(names) > MAX_SAMPLE_FILES:
        raise InvalidDataset(f"{display_name} holds {len(names)} samples, over the limit of {MAX_SAMPLE_FILES}")
    total = 0
    for name in names:
        group = _hdf5_member(source, name, display_name)
        if not isinstance(group, h5py.Group):
            raise InvalidDataset(f"{display_name}: {name!r} is not a group; store one group per sample holding one dataset per model input")
        datasets = {key: _hdf5_dataset(group, key, f"{name}/{key}") for key in sorted(group.keys())}
        # The sizes the metadata declares, checked before a byte is read: a chunked dataset of 2^36
        # unwritten elements is a few KB on disk and 256 GB once read.
        total += sum(_hdf5_declared_bytes(dataset, f"{name}/{key}") for key, dataset in datasets.items())
        if max_bytes is not None and total > max_bytes:
            raise InvalidDataset(f"the samples declare {_size_text(total)} of arrays by {name!r}, over this server's limit of "
                                 f"{_size_text(max_bytes)} (KILN_MAX_DATASET_BYTES)")
        arrays = {key: np.asarray(dataset[()]) for key, dataset in datasets.items()}
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        archive.writestr(f"{name}.npz", buffer.getvalue())
    return len(names)


def _hdf5_member(group, name: str, display_name: str):
    import h5py

    link = group.get(name, getlink=True)
    if not isinstance(link, h5py.HardLink):
        raise InvalidDataset(f"{display_name}: {name!r} is a link; only data stored in the file itself is read")
    return group[name]


def _hdf5_dataset(group, key: str, where: str):
    """One input's HDF5 dataset, checked from its metadata (where its data lives, its dtype); not read."""
    import h5py

    item = _hdf5_member(group, key, where)
    if not isinstance(item, h5py.Dataset):
        raise InvalidDataset(f"{where} is not a dataset of numbers")
    if item.external or item.is_virtual:
        raise InvalidDataset(f"{where} stores its data outside the file; only data stored in the file itself is read")
    if item.dtype.newbyteorder("=") not in ALLOWED_DTYPES:
        raise InvalidDataset(f"{where} has dtype {item.dtype}; only numeric arrays are accepted")
    return item


def _hdf5_declared_bytes(dataset, where: str) -> int:
    if dataset.shape is None:
        raise InvalidDataset(f"{where} has no shape (an empty dataspace); store an array")
    return math.prod(dataset.shape) * dataset.dtype.itemsize
