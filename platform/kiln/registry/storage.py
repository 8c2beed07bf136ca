"""Content-addressed blob files through Django's storage API: a local folder, or S3-compatible storage.

Every blob is stored under `<sha256[:2]>/<sha256>` in the `blobs` storage (settings.STORAGES). With
the local folder, workers read the stored file in place; with S3, a host that needs a file on disk
(ONNX Runtime, the quantizers) keeps a verified copy under `BLOB_ROOT/cache`, filled on first use.
"""
from __future__ import annotations

import base64
import hashlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path

from django.conf import settings
from django.core.files import File
from django.core.files.storage import FileSystemStorage, Storage, storages

from workers.archive import extract_model_archive

CHUNK = 1024 * 1024
STORAGE_ALIAS = "blobs"
# Agents stage engines here before the server verifies them and copies them under their digest.
INCOMING_PREFIX = "incoming/"


class LocalBlobStorage(FileSystemStorage):
    """The local folder (`KILN_BLOB_ROOT`): a write lands whole (staged, then renamed) and replaces its name."""

    @property
    def base_location(self):
        return self._value_or_setting(self._location, settings.BLOB_ROOT)

    @property
    def location(self):
        return os.path.abspath(self.base_location)

    def get_available_name(self, name, max_length=None):
        # Names are digests: the same name always means the same bytes, so it is overwritten.
        return name

    def _save(self, name, content):
        target = Path(self.path(name))
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex}.partial")
        try:
            if hasattr(content, "temporary_file_path"):
                shutil.move(content.temporary_file_path(), staging)
            else:
                with open(staging, "wb") as handle:
                    for chunk in content.chunks(CHUNK):
                        handle.write(chunk)
            os.replace(staging, target)
        finally:
            staging.unlink(missing_ok=True)
        return name


class _MovableFile(File):
    """A source file the storage may move instead of copying (a finished upload's part file)."""

    def temporary_file_path(self) -> str:
        return self.name


def blob_storage() -> Storage:
    return storages[STORAGE_ALIAS]


def is_local() -> bool:
    """Whether blobs live in a folder this host can read in place (else S3: presigned URLs, a local cache)."""
    return isinstance(blob_storage(), FileSystemStorage)


def _check_digest(sha256: str) -> str:
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise ValueError("not a sha256 hex digest")
    return sha256


def blob_key(sha256: str) -> str:
    _check_digest(sha256)
    return f"{sha256[:2]}/{sha256}"


def extracted_dir(sha256: str) -> Path:
    """Where a zipped model's members live once safely extracted (a local, rebuildable copy)."""
    return settings.BLOB_ROOT / "extracted" / _check_digest(sha256)


def extracted_model(sha256: str) -> Path:
    """The extracted members of a zipped model on this host, extracted again (safely) when missing.

    The extraction is a local copy of what the stored zip holds: another host (a worker reading
    from S3) or a cleared folder rebuilds it from the blob.
    """
    target = extracted_dir(sha256)
    if target.exists():
        return target
    staging = new_temp_dir("extract-")
    try:
        extract_model_archive(local_path(sha256), staging, max_total_bytes=settings.MAX_ARCHIVE_UNCOMPRESSED_BYTES,
                              max_ratio=settings.MAX_ARCHIVE_RATIO)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(staging, target)
        except OSError:
            if not target.exists():  # another process finished first otherwise
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _cache_path(sha256: str) -> Path:
    return settings.BLOB_ROOT / "cache" / sha256[:2] / sha256


def file_sha256(path: Path) -> tuple[str, int]:
    with open(path, "rb") as handle:
        return stream_sha256(handle)


def stream_sha256(handle) -> tuple[str, int]:
    """Digest and size of a readable binary stream, read in chunks."""
    digest = hashlib.sha256()
    size = 0
    while chunk := handle.read(CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def stored_sha256(key: str) -> str | None:
    """The digest of what is stored under `key` now, or None when nothing is."""
    storage = blob_storage()
    if not storage.exists(key):
        return None
    try:
        with storage.open(key, "rb") as handle:
            return stream_sha256(handle)[0]
    except FileNotFoundError:
        return None


def put_file(source: Path, *, sha256: str, move: bool = False) -> str:
    """Store a file under its digest; an existing copy is kept when it still holds those bytes.

    A stored copy that no longer hashes to its name (a damaged disk, a hand edit) would otherwise
    be served for every later upload of the same bytes; it is replaced instead. With `move`, the
    source is consumed: moved into the folder, or (S3) kept as this host's cached copy.
    """
    key = blob_key(sha256)
    storage = blob_storage()
    source = Path(source)
    if stored_sha256(key) != sha256:
        if move and is_local():
            storage.save(key, _MovableFile(None, name=str(source)))
        else:
            with open(source, "rb") as handle:
                storage.save(key, File(handle, name=key))
    if move and source.exists():
        if is_local():
            source.unlink()
        else:
            _cache_fill_from(source, sha256)
    return key


def _cache_fill_from(source: Path, sha256: str) -> None:
    target = _cache_path(sha256)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(source, target)


def local_path(sha256: str) -> Path:
    """A file on this host holding the blob's bytes: the stored file itself, or (S3) a verified cached copy."""
    storage = blob_storage()
    key = blob_key(sha256)
    if is_local():
        return Path(storage.path(key))
    target = _cache_path(sha256)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex}.partial")
    digest = hashlib.sha256()
    try:
        with storage.open(key, "rb") as remote, open(staging, "wb") as handle:
            while chunk := remote.read(CHUNK):
                digest.update(chunk)
                handle.write(chunk)
        if digest.hexdigest() != sha256:
            raise OSError(f"the stored copy of blob {sha256} no longer hashes to its name")
        os.replace(staging, target)
    finally:
        staging.unlink(missing_ok=True)
    return target


def blob_exists(sha256: str) -> bool:
    return blob_storage().exists(blob_key(sha256))


def delete_file(sha256: str) -> None:
    """Remove a digest's stored file, this host's cached copy and, for zipped models, its extracted members."""
    blob_storage().delete(blob_key(sha256))
    _cache_path(sha256).unlink(missing_ok=True)
    shutil.rmtree(extracted_dir(sha256), ignore_errors=True)


# -- presigned URLs (S3 only): agents and browsers move bytes without the server in the path ----

def _s3_client(storage):
    """The boto3 client that signs URLs: it must sign for the host the agent or browser will reach."""
    public = settings.S3_PUBLIC_ENDPOINT_URL
    if not public or public == settings.S3_ENDPOINT_URL:
        return storage.connection.meta.client
    import boto3  # only with S3 configured
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=public, region_name=storage.region_name, aws_access_key_id=storage.access_key or None,
                        aws_secret_access_key=storage.secret_key or None,
                        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))


def _presign(method: str, key: str, **params) -> str:
    storage = blob_storage()
    return _s3_client(storage).generate_presigned_url(
        method, Params={"Bucket": storage.bucket_name, "Key": storage._normalize_name(key), **params},
        ExpiresIn=settings.S3_PRESIGN_SECONDS,
    )


def presigned_download_url(sha256: str, *, filename: str) -> str | None:
    """A short-lived GET URL of one blob (None with the local folder: the server streams it then)."""
    if is_local():
        return None
    safe_name = "".join(c for c in filename if c.isprintable() and c not in '"\\;') or "download.bin"
    return _presign("get_object", blob_key(sha256), ResponseContentDisposition=f'attachment; filename="{safe_name}"')


def incoming_key(label: str) -> str:
    """A fresh, unguessable name for one staged upload."""
    return f"{INCOMING_PREFIX}{label}-{uuid.uuid4().hex}"


def presigned_upload(key: str, *, sha256: str, size_bytes: int) -> dict:
    """A short-lived PUT of exactly one staged object; real S3 and MinIO also check the length and digest."""
    checksum = base64.b64encode(bytes.fromhex(_check_digest(sha256))).decode()
    url = _presign("put_object", key, ContentLength=size_bytes, ChecksumSHA256=checksum)
    return {"method": "PUT", "url": url, "headers": {"x-amz-checksum-sha256": checksum}, "expires_in": settings.S3_PRESIGN_SECONDS}


class IncomingRejected(Exception):
    """A staged upload is missing, too large, or does not hash to what was announced."""


def incoming_commit(key: str, *, sha256: str, size_bytes: int, max_bytes: int) -> str:
    """Verify a staged object and copy it under its digest inside the storage; returns the blob key.

    The bytes are hashed here (streamed, never held in memory) because a storage that does not check
    checksums on PUT (moto, some S3 clones) would otherwise let an agent plant bytes under any digest.
    The staged object is removed whatever the outcome.
    """
    storage = blob_storage()
    try:
        if not key.startswith(INCOMING_PREFIX) or not storage.exists(key):
            raise IncomingRejected("the staged upload is not in storage; upload it to the URL given, then commit")
        stored_size = storage.size(key)
        if stored_size > max_bytes or stored_size != size_bytes:
            raise IncomingRejected(f"the staged upload has {stored_size} bytes, not the {size_bytes} announced (limit {max_bytes})")
        with storage.open(key, "rb") as handle:
            actual, _ = stream_sha256(handle)
        if actual != sha256:
            raise IncomingRejected(f"the staged upload's sha256 is {actual}, not the {sha256} announced")
        target = blob_key(sha256)
        client = storage.connection.meta.client
        client.copy({"Bucket": storage.bucket_name, "Key": storage._normalize_name(key)}, storage.bucket_name,
                    storage._normalize_name(target))
        return target
    finally:
        storage.delete(key)


def new_temp_dir(prefix: str) -> Path:
    settings.UPLOAD_TMP_DIR.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=settings.UPLOAD_TMP_DIR))
