"""Uploads: multipart bodies hashed while streamed to disk, and the part files of resumable uploads."""
from __future__ import annotations

import base64
import binascii
import fcntl
import hashlib
import os
from pathlib import Path

from django.conf import settings
from django.core.files.uploadhandler import TemporaryFileUploadHandler

from kiln.core.errors import KilnError, upload_too_large


class HashingUploadHandler(TemporaryFileUploadHandler):
    """Always spool to a temp file, compute sha256 on the way, stop at the size limit."""

    def new_file(self, *args, **kwargs):
        super().new_file(*args, **kwargs)
        self.digest = hashlib.sha256()
        self.received = 0

    def receive_data_chunk(self, raw_data, start):
        self.received += len(raw_data)
        if self.received > settings.MAX_UPLOAD_BYTES:
            raise upload_too_large()
        self.digest.update(raw_data)
        try:
            return super().receive_data_chunk(raw_data, start)
        except OSError:
            # A full disk: the parser drops this half-written file without closing it, so remove it now.
            self.file.close()
            raise

    def file_complete(self, file_size):
        uploaded = super().file_complete(file_size)
        uploaded.sha256 = self.digest.hexdigest()
        return uploaded



# -- resumable uploads (tus): the bytes on disk ------------------------------------------------

RESUMABLE_READ_BYTES = 1024 * 1024


def parts_dir() -> Path:
    return settings.UPLOAD_TMP_DIR / "resumable"


def part_path(upload_id) -> Path:
    return parts_dir() / f"{upload_id}.part"


def part_bytes(upload_id) -> int:
    """How many bytes of an upload this host holds (0 when its part file is not here)."""
    try:
        return part_path(upload_id).stat().st_size
    except FileNotFoundError:
        return 0


def parse_metadata(header: str) -> dict[str, str]:
    """tus `Upload-Metadata`: comma-separated `key base64value` pairs."""
    pairs = {}
    for item in (header or "").split(","):
        key, _, encoded = item.strip().partition(" ")
        if not key:
            continue
        try:
            pairs[key] = base64.b64decode(encoded.strip(), validate=True).decode("utf-8") if encoded.strip() else ""
        except (binascii.Error, ValueError):  # not base64, not ASCII, not UTF-8 once decoded
            raise KilnError(f"Upload-Metadata value of {key!r} is not base64 text.", code="invalid_metadata") from None
    return pairs


class ChunkInterrupted(Exception):
    """The client stopped sending mid-chunk; the bytes received are kept."""

    def __init__(self, written: int):
        super().__init__(f"the chunk broke off after {written} bytes")
        self.written = written


def append_chunk(*, path: Path, offset: int, stream, length: int) -> int:
    """Write up to `length` bytes of `stream` at `offset`; returns the bytes written.

    One writer at a time (an exclusive lock on the part file); whatever sits past `offset` from an
    earlier, unrecorded write is cut first, so the file always ends where the recorded offset says.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(path, "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise KilnError("Another request is writing to this upload.", code="upload_busy", status_code=423) from None
        handle.truncate(offset)
        handle.seek(offset)
        try:
            while written < length:
                block = stream.read(min(RESUMABLE_READ_BYTES, length - written))
                if not block:
                    break
                handle.write(block)
                written += len(block)
        except Exception as exc:  # a dropped connection surfaces as whatever the WSGI server raises
            handle.flush()
            os.fsync(handle.fileno())
            raise ChunkInterrupted(written) from exc
        handle.flush()
        os.fsync(handle.fileno())
    if written < length:
        raise ChunkInterrupted(written)
    return written


class StoredUpload:
    """A finished resumable upload, shaped like Django's uploaded file for the registry's services."""

    def __init__(self, *, name: str, path: Path, sha256: str, blob=None):
        self.name = name
        self.sha256 = sha256
        self.blob = blob
        self._path = path

    def temporary_file_path(self) -> str:
        return str(self._path)
