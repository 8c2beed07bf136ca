"""Stream rows of the arrays inside an `.npz` without loading them whole and without unpickling.

A sample is read as its own bytes from the archive member, so memory stays bounded by one block
of rows however big the file is. An array stored in Fortran order has no contiguous rows on disk:
that one array is read whole.
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ArrayHeader:
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


def read_npy_header(stream) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(stream)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(stream)
    raise ValueError(f"unsupported .npy format version {version}")


def read_header(archive: zipfile.ZipFile, member: str) -> tuple[ArrayHeader, int]:
    """The header of one `.npy` member and the number of header bytes before its data."""
    with archive.open(member) as stream:
        shape, fortran_order, dtype = read_npy_header(stream)
        header_bytes = stream.tell()
    return ArrayHeader(member[: -len(".npy")], member, tuple(shape), np.dtype(dtype), bool(fortran_order)), header_bytes


def read_headers(archive: zipfile.ZipFile) -> dict[str, ArrayHeader]:
    return {header.name: header for header, _ in (read_header(archive, member) for member in archive.namelist() if member.endswith(".npy"))}


def read_exact(stream, size: int, name: str) -> bytearray:
    buffer = bytearray(size)
    view = memoryview(buffer)
    filled = 0
    while filled < size:
        got = stream.readinto(view[filled:])
        if not got:
            raise ValueError(f"array {name!r} is truncated")
        filled += got
    return buffer


def iter_rows(archive: zipfile.ZipFile, header: ArrayHeader, rows: int, samples: int) -> Iterator[np.ndarray]:
    """Yield consecutive blocks of `rows` samples, reading only those bytes from the archive."""
    native = header.dtype.newbyteorder("=")
    if header.fortran_order:
        # Samples are strided across the whole array on disk; no way to stream them.
        with archive.open(header.member) as stream:
            whole = np.lib.format.read_array(stream, allow_pickle=False)
        for start in range(0, samples, rows):
            yield np.ascontiguousarray(whole[start : min(start + rows, samples)], dtype=native)
        return
    with archive.open(header.member) as stream:
        read_npy_header(stream)
        for start in range(0, samples, rows):
            count = min(rows, samples - start)
            buffer = read_exact(stream, count * header.row_bytes, header.name)
            block = np.frombuffer(buffer, dtype=header.dtype).reshape((count, *header.shape[1:]))
            # Runtimes read raw memory: hand them native byte order whatever the file used.
            yield block.astype(native, copy=False)
