"""Content-addressed blob files on the local filesystem."""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from django.conf import settings

CHUNK = 1024 * 1024


def blob_path(sha256: str) -> Path:
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise ValueError("not a sha256 hex digest")
    return settings.BLOB_ROOT / sha256[:2] / sha256


def extracted_dir(sha256: str) -> Path:
    """Where a zipped model's members live once safely extracted."""
    return settings.BLOB_ROOT / "extracted" / sha256


def file_sha256(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def put_file(source: Path, *, sha256: str, move: bool = False) -> Path:
    """Store a file under its digest; an existing copy is kept when it still holds those bytes.

    A stored copy that no longer hashes to its name (a damaged disk, a hand edit) would otherwise
    be served for every later upload of the same bytes; it is replaced instead.
    """
    target = blob_path(sha256)
    if target.exists() and file_sha256(target)[0] == sha256:
        if move:
            Path(source).unlink(missing_ok=True)
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        if move:
            shutil.move(str(source), staging)
        else:
            shutil.copyfile(source, staging)
    except OSError:
        staging.unlink(missing_ok=True)  # a full disk must not leave half a blob behind
        raise
    os.replace(staging, target)
    return target


def delete_file(sha256: str) -> None:
    """Remove a digest's file and, for zipped models, its extracted members."""
    blob_path(sha256).unlink(missing_ok=True)
    shutil.rmtree(extracted_dir(sha256), ignore_errors=True)


def new_temp_dir(prefix: str) -> Path:
    import tempfile

    settings.UPLOAD_TMP_DIR.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=settings.UPLOAD_TMP_DIR))
