"""Safely extract an uploaded .zip that holds one .onnx model plus its external-data files.

Everything in an upload is hostile until proven otherwise: entry names may climb out of the
destination, headers may lie about sizes, entries may be symlinks, and the model's external-data
`location` fields may point anywhere on disk. Each is checked before or while bytes are written.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import zipfile
import zlib
from pathlib import Path, PurePosixPath

import onnx

from workers.inspect import InvalidModel, iter_tensors, load_graph_only

_CHUNK_BYTES = 1 << 20
_DRIVE_LETTER = re.compile(r"^[A-Za-z]:")
_SUPPORTED_COMPRESSION = {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA}


class UnsafeArchive(ValueError):
    """The archive tries something dangerous (path escape, symlink, bomb) or breaks the one-model rule."""


class UnsupportedArchive(ValueError):
    """The file is not a zip this extractor can read (corrupt, encrypted, unknown compression)."""


def extract_model_archive(
    zip_path: str | Path,
    dest_dir: str | Path,
    *,
    max_total_bytes: int,
    max_ratio: float = 100,
    max_entries: int = 1000,
) -> Path:
    """Extract a model zip into `dest_dir` and return the path of its single .onnx file.

    On any error, everything this call created is removed again and the error is raised.
    """
    zip_path, dest_dir = Path(zip_path), Path(dest_dir)
    created: list[Path] = []
    dest_existed = dest_dir.exists()
    try:
        dest_dir.mkdir(parents=True, exist_ok=True)
        dest_root = dest_dir.resolve()
        with _open_zip(zip_path) as archive:
            members = _checked_members(archive, max_total_bytes=max_total_bytes, max_ratio=max_ratio, max_entries=max_entries)
            model_entry = _single_onnx_entry(members)
            written_total = 0
            for info, relative in members:
                target = _target_path(dest_root, relative)
                try:
                    if info.is_dir():
                        _make_dirs(target, dest_root, created)
                        continue
                    _make_dirs(target.parent, dest_root, created)
                    written_total = _extract_member(
                        archive, info, target, created,
                        written_before=written_total, max_total_bytes=max_total_bytes, max_ratio=max_ratio,
                    )
                except (FileExistsError, NotADirectoryError, IsADirectoryError) as error:
                    # "a" as a file and "a/b" as another entry, or a name already taken in dest_dir.
                    raise UnsafeArchive(f"entry {info.filename!r} clashes with another file: {error.strerror}") from error
        model_path = _target_path(dest_root, model_entry)
        check_external_data_locations(model_path, root=dest_root)
        return model_path
    except BaseException:
        _remove_created(created)
        if not dest_existed:
            shutil.rmtree(dest_dir, ignore_errors=True)
        raise


def check_external_data_locations(model_path: str | Path, *, root: str | Path) -> None:
    """Check that every external-data reference of a model names an existing file inside `root`.

    Reads only the graph, never the weights.
    """
    model_path, root = Path(model_path), Path(root).resolve()
    try:
        model = load_graph_only(model_path)
    except InvalidModel as error:
        raise UnsafeArchive(f"the archive's model cannot be read: {error}") from error
    for tensor in iter_tensors(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        entries = {entry.key: entry.value for entry in tensor.external_data}
        location = entries.get("location", "")
        label = f"tensor {tensor.name!r} external data location {location!r}"
        if not location or _unsafe_name(location):
            raise UnsafeArchive(f"{label} is not a plain relative path inside the archive")
        data_path = (model_path.parent / location).resolve()
        if not data_path.is_relative_to(root):
            raise UnsafeArchive(f"{label} points outside the archive")
        if not data_path.is_file():
            raise UnsafeArchive(f"{label} points to a file that is not in the archive")
        end = int(entries.get("offset", 0) or 0) + int(entries.get("length", 0) or 0)
        if end > data_path.stat().st_size:
            raise UnsafeArchive(f"{label} reads past the end of {location} ({end} > {data_path.stat().st_size} bytes)")


def _open_zip(zip_path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(zip_path)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as error:
        raise UnsupportedArchive(f"{zip_path.name} is not a readable zip archive: {error}") from error


def _checked_members(
    archive: zipfile.ZipFile, *, max_total_bytes: int, max_ratio: float, max_entries: int
) -> list[tuple[zipfile.ZipInfo, PurePosixPath]]:
    """Check every entry's header before a byte is written; return entries with normalized names."""
    infos = archive.infolist()
    if len(infos) > max_entries:
        raise UnsafeArchive(f"the archive has {len(infos)} entries; at most {max_entries} are allowed")
    members: list[tuple[zipfile.ZipInfo, PurePosixPath]] = []
    seen: set[str] = set()
    declared_total = 0
    for info in infos:
        name = info.filename
        if _unsafe_name(name):
            raise UnsafeArchive(f"entry {name!r} would be extracted outside the destination folder")
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise UnsafeArchive(f"entry {name!r} is a symbolic link; links are not allowed")
        if mode and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)) and stat.S_IFMT(mode):
            raise UnsafeArchive(f"entry {name!r} is not a regular file")
        if info.flag_bits & 0x1:
            raise UnsupportedArchive(f"entry {name!r} is encrypted; upload an unencrypted zip")
        if info.compress_type not in _SUPPORTED_COMPRESSION:
            raise UnsupportedArchive(f"entry {name!r} uses an unsupported compression method ({info.compress_type})")
        relative = PurePosixPath(name.replace("\\", "/"))
        # Case-folded so that two names cannot collide on a case-insensitive filesystem.
        key = str(relative).casefold()
        if key in seen:
            raise UnsafeArchive(f"entry {name!r} appears more than once")
        seen.add(key)
        declared_total += info.file_size
        if declared_total > max_total_bytes:
            raise UnsafeArchive(f"the archive expands to more than {max_total_bytes} bytes")
        if info.file_size > max_ratio * max(info.compress_size, 1):
            raise UnsafeArchive(f"entry {name!r} compresses more than {max_ratio}:1; refusing a likely zip bomb")
        members.append((info, relative))
    return members


def _unsafe_name(name: str) -> bool:
    """True for names that are absolute, carry a drive letter, climb with `..`, or hide control bytes."""
    normalized = name.replace("\\", "/")
    if not normalized or normalized.startswith("/") or _DRIVE_LETTER.match(normalized) or "\x00" in normalized:
        return True
    return any(part == ".." for part in normalized.split("/"))


def _single_onnx_entry(members: list[tuple[zipfile.ZipInfo, PurePosixPath]]) -> PurePosixPath:
    onnx_entries = [relative for info, relative in members if not info.is_dir() and relative.suffix.lower() == ".onnx"]
    if not onnx_entries:
        raise UnsafeArchive("the archive holds no .onnx file; it must hold exactly one")
    if len(onnx_entries) > 1:
        names = ", ".join(sorted(str(entry) for entry in onnx_entries))
        raise UnsafeArchive(f"the archive holds {len(onnx_entries)} .onnx files ({names}); it must hold exactly one")
    return onnx_entries[0]


def _target_path(dest_root: Path, relative: PurePosixPath) -> Path:
    target = dest_root.joinpath(*relative.parts)
    # Belt and braces after the name check: resolve symlinks already on disk too.
    if not target.resolve().is_relative_to(dest_root):
        raise UnsafeArchive(f"entry {str(relative)!r} would be extracted outside the destination folder")
    return target


def _make_dirs(directory: Path, dest_root: Path, created: list[Path]) -> None:
    missing = []
    current = directory
    while current != dest_root and not current.exists():
        missing.append(current)
        current = current.parent
    for path in reversed(missing):
        path.mkdir()
        created.append(path)


def _extract_member(
    archive: zipfile.ZipFile,
    info: zipfile.ZipInfo,
    target: Path,
    created: list[Path],
    *,
    written_before: int,
    max_total_bytes: int,
    max_ratio: float,
) -> int:
    """Stream one entry to disk, counting real bytes because declared sizes can lie; return the new total."""
    # Opening an entry reads its local header (a bad offset, a name that does not decode): the archive's fault, a 400.
    try:
        source = archive.open(info)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, RuntimeError) as error:
        raise UnsupportedArchive(f"entry {info.filename!r} cannot be read: {error}") from error
    with source:
        # O_EXCL and O_NOFOLLOW: never overwrite, never write through a link planted by an earlier entry.
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
        descriptor = os.open(target, flags, 0o644)
        created.append(target)
        written_total = written_before
        written_entry = 0
        ratio_limit = max_ratio * max(info.compress_size, 1)
        try:
            with os.fdopen(descriptor, "wb") as output:
                while chunk := source.read(_CHUNK_BYTES):
                    written_entry += len(chunk)
                    written_total += len(chunk)
                    if written_entry > info.file_size:
                        raise UnsafeArchive(f"entry {info.filename!r} holds more bytes than its header declares")
                    if written_total > max_total_bytes:
                        raise UnsafeArchive(f"the archive expands to more than {max_total_bytes} bytes")
                    if written_entry > ratio_limit:
                        raise UnsafeArchive(f"entry {info.filename!r} compresses more than {max_ratio}:1; refusing a likely zip bomb")
                    output.write(chunk)
        except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as error:
            raise UnsupportedArchive(f"entry {info.filename!r} cannot be read: {error}") from error
    return written_total


def _remove_created(created: list[Path]) -> None:
    for path in reversed(created):
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        except OSError:
            pass
