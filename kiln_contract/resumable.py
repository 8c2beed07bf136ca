"""Resumable uploads (tus 1.0.0 core + creation), the client side shared by the agent and `kiln_client.Client`.

A file goes up in chunks (`PATCH` at an `Upload-Offset`). When a connection drops, the uploader
asks the server where it stands (`HEAD`) and goes on from there, so a broken transfer of gigabytes
costs only the bytes in flight. The sha256 of the whole file travels in `Upload-Metadata`; the
server checks it against the assembled file before it becomes a blob.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

import requests

from kiln_contract.http import ApiError, HttpClient, ServerUnavailable

logger = logging.getLogger(__name__)

TUS_VERSION = "1.0.0"
DEFAULT_CHUNK_BYTES = 32 * 1024 * 1024
READ_BYTES = 1024 * 1024

Progress = Callable[[int, int], None]


class FileSlice:
    """`length` bytes of a file from `start`, read lazily: requests streams it and knows its size."""

    def __init__(self, path: Path, start: int, length: int):
        self.handle = open(path, "rb")  # noqa: SIM115 - closed by the uploader after the request
        self.handle.seek(start)
        self.remaining = length
        self.length = length

    def __len__(self) -> int:
        return self.length

    def read(self, size: int = -1) -> bytes:
        if self.remaining <= 0:
            return b""
        size = self.remaining if size is None or size < 0 else min(size, self.remaining)
        data = self.handle.read(size)
        self.remaining -= len(data)
        return data

    def close(self) -> None:
        self.handle.close()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(READ_BYTES):
            digest.update(block)
    return digest.hexdigest()


def _metadata(pairs: dict[str, str]) -> str:
    return ",".join(f"{key} {base64.b64encode(value.encode()).decode()}" for key, value in pairs.items() if value)


def upload_create(client: HttpClient, path: Path, *, create_path: str, sha256: str) -> str:
    """Announce an upload; returns its URL."""
    size = Path(path).stat().st_size
    headers = {"Tus-Resumable": TUS_VERSION, "Upload-Length": str(size),
               "Upload-Metadata": _metadata({"filename": Path(path).name, "sha256": sha256})}
    response = client.request("POST", create_path, headers=headers)
    location = response.headers.get("Location")
    if not location:
        raise ApiError(response.status_code, "the server created an upload but sent no Location")
    return location


def upload_offset(client: HttpClient, url: str) -> int:
    """Where the server stands: the bytes it holds of this upload."""
    response = client.request("HEAD", url, headers={"Tus-Resumable": TUS_VERSION})
    return int(response.headers["Upload-Offset"])


def upload_resume(client: HttpClient, url: str, path: Path, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                  progress: Progress | None = None) -> dict:
    """Send the rest of `path` to an existing upload; returns the upload's JSON once complete."""
    size = Path(path).stat().st_size
    offset = upload_offset(client, url)
    failures = 0
    while offset < size:
        if progress:
            progress(offset, size)
        length = min(chunk_bytes, size - offset)
        body = FileSlice(Path(path), offset, length)
        headers = {"Tus-Resumable": TUS_VERSION, "Upload-Offset": str(offset),
                   "Content-Type": "application/offset+octet-stream"}
        try:
            response = client.request("PATCH", url, data=body, headers=headers, max_attempts=1,
                                      read_timeout_s=max(client.timeout_s, 300.0))
            offset = int(response.headers.get("Upload-Offset", offset + length))
            failures = 0
            continue
        except (ServerUnavailable, requests.RequestException) as exc:
            failure = exc
        except ApiError as exc:
            # 409: the server's offset differs from ours (an earlier chunk landed after all);
            # 423: the server still writes the broken chunk (it has not yet seen the connection drop).
            if exc.status not in (409, 423):
                raise
            failure = exc
        finally:
            body.close()
        # A 409 means the server is ahead of what it last told us (a broken chunk still landing):
        # that is progress, not a failed try, so it counts a quarter.
        failures += 0.25 if isinstance(failure, ApiError) and failure.status == 409 else 1
        if failures >= client.retry.max_attempts:
            raise ServerUnavailable(f"upload of {path} stopped at byte {offset} of {size}: {failure}")
        wait_s = client.retry.backoff_s(int(failures) - 1 if failures >= 1 else 0)
        logger.warning("upload of %s broke off at byte %d (%s); resuming in %.1f s", path, offset, failure, wait_s)
        client.sleep(wait_s)
        offset = upload_offset(client, url)
    if progress:
        progress(size, size)
    return client._json(client.request("GET", url))


def upload_file(client: HttpClient, path: Path, *, create_path: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                progress: Progress | None = None, sha256: str | None = None) -> dict:
    """Upload a whole file resumably; returns `{"id", "sha256", "offset", "length", "complete", ...}`."""
    sha256 = sha256 or file_sha256(Path(path))
    url = upload_create(client, Path(path), create_path=create_path, sha256=sha256)
    answer = upload_resume(client, url, Path(path), chunk_bytes=chunk_bytes, progress=progress)
    if answer.get("sha256") != sha256:
        raise ApiError(400, f"the server stored sha256 {answer.get('sha256')}, not {sha256}", "digest_mismatch")
    return answer
