"""HTTP clients of the Kiln server: the retrying base, and the agent protocol (`/api/agent/v1/`).

`HttpClient` is shared with `kiln.Client` (the user-facing Python client). It retries only what may succeed on a second try: connection errors and timeouts, 429 and 5xx,
with capped exponential backoff and full jitter, honouring Retry-After. Any other 4xx is an
answer and raises at once.
"""

from __future__ import annotations

import email.utils
import hashlib
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests

logger = logging.getLogger(__name__)

API_PREFIX = "/api/agent/v1/"
DOWNLOAD_CHUNK_BYTES = 1 << 20


class ApiError(Exception):
    """The server answered a request with an error that retrying will not fix."""

    def __init__(self, status: int, message: str, code: str | None = None, details=None):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.code = code
        self.details = details or {}


class AgentUnauthorized(ApiError):
    """401: the agent or registration token is wrong or revoked; the agent must stop."""


class StaleAttempt(ApiError):
    """409: this attempt of the task is no longer ours; drop the task."""


class ServerUnavailable(Exception):
    """Retries ran out on network errors, 429 or 5xx."""


@dataclass
class RetryPolicy:
    """Capped exponential backoff with full jitter (sleep uniform in [0, min(cap, base·2^n)])."""

    max_attempts: int = 8
    base_s: float = 0.5
    cap_s: float = 30.0
    max_retry_after_s: float = 300.0

    def backoff_s(self, retry_number: int) -> float:
        return random.uniform(0.0, min(self.cap_s, self.base_s * (2**retry_number)))


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date), or None."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _is_retryable_status(status: int) -> bool:
    return status == 429 or 500 <= status <= 599


def _error_from(response: requests.Response, error_classes: dict | None = None) -> ApiError:
    message, code, details = None, None, None
    try:
        body = response.json()
        if isinstance(body, dict):
            message = body.get("error") or body.get("detail")
            code = body.get("code")
            details = body.get("details")
    except ValueError:
        pass
    if not message:
        message = (response.text or response.reason or "").strip()[:500] or "no message"
    error_class = (error_classes or {}).get(response.status_code, ApiError)
    return error_class(response.status_code, str(message), code, details)


class HttpClient:
    """One server, one bearer token, the retry policy; paths are relative to `api_prefix`."""

    api_prefix = "/"
    user_agent = "kiln"
    # Statuses that deserve their own exception class in this client's callers.
    error_classes: dict[int, type[ApiError]] = {}

    def __init__(
        self,
        server: str,
        token: str | None = None,
        *,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 10.0,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], Any] = time.sleep,
    ):
        self.server = server.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.retry = retry or RetryPolicy()
        self.sleep = sleep
        self.session = requests.Session()
        self.session.headers["User-Agent"] = self.user_agent
        self.session.headers["Accept"] = "application/json"

    # -- plumbing ------------------------------------------------------------------------------

    def url(self, path: str) -> str:
        """Absolute URL of a protocol path ("tasks/lease") or a server path ("/api/...")."""
        if path.startswith(("http://", "https://")):
            return path
        if path.startswith("/"):
            return urljoin(self.server + "/", path.lstrip("/"))
        return self.server + self.api_prefix + path

    def on_server(self, url: str) -> bool:
        """Whether an absolute URL points at this client's server (same scheme, host and port)."""
        target, server = urlsplit(url), urlsplit(self.server)
        return (target.scheme, target.netloc) == (server.scheme, server.netloc)

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        data: dict | None = None,
        body_factory: Callable[[], tuple[Any, str]] | None = None,
        read_timeout_s: float | None = None,
        stream: bool = False,
        authenticated: bool = True,
        headers: dict | None = None,
        params: dict | None = None,
        max_attempts: int | None = None,
    ) -> requests.Response:
        """Send one call, retrying per the policy; return a 2xx response or raise.

        `max_attempts=1` is for calls that must not be repeated blindly (an upload chunk whose
        offset the server may already have moved): the caller asks the server where it stands.
        """
        url = self.url(path)
        headers = dict(headers or {})
        attempts = max_attempts or self.retry.max_attempts
        if authenticated and self.token and self.on_server(url):
            # A presigned storage URL carries its own signature; the token never leaves the server's origin.
            headers["Authorization"] = f"Bearer {self.token}"
        timeout = (self.connect_timeout_s, read_timeout_s or self.timeout_s)
        retry_number = 0
        while True:
            body, send_headers = data, headers
            if body_factory is not None:
                # A streamed body (e.g. a multipart encoder): built afresh for every try.
                body, content_type = body_factory()
                send_headers = {**headers, "Content-Type": content_type}
            try:
                response = self.session.request(
                    method, url, json=json, data=body, headers=send_headers,
                    timeout=timeout, stream=stream, params=params,
                )
            except (requests.ConnectionError, requests.Timeout) as exc:
                failure, wait_s = f"{type(exc).__name__}: {exc}", None
            else:
                if response.status_code < 400:
                    return response
                if not _is_retryable_status(response.status_code):
                    raise _error_from(response, self.error_classes)
                failure = f"HTTP {response.status_code}"
                wait_s = parse_retry_after(response.headers.get("Retry-After"))
                if wait_s is not None:
                    wait_s = min(wait_s, self.retry.max_retry_after_s)
                response.close()
            if retry_number + 1 >= attempts:
                raise ServerUnavailable(
                    f"{method} {url} failed {retry_number + 1} times, last: {failure}"
                )
            if wait_s is None:
                wait_s = self.retry.backoff_s(retry_number)
            logger.warning("%s %s: %s; retrying in %.1f s", method, url, failure, wait_s)
            self.sleep(wait_s)
            retry_number += 1

    def _json(self, response: requests.Response) -> dict:
        if response.status_code == 204 or not response.content:
            return {}
        try:
            return response.json()
        except ValueError:
            raise ApiError(response.status_code, "the server answered with a body that is not JSON") from None

    def download(self, url: str, destination: Path) -> str:
        """Stream `url` into `destination`; return the sha256 (hex) of the bytes received."""
        destination = Path(destination)
        partial = destination.with_name(destination.name + ".part")
        retry_number = 0
        while True:
            digest = hashlib.sha256()
            response = self.request("GET", url, stream=True, read_timeout_s=max(self.timeout_s, 60.0))
            try:
                with open(partial, "wb") as handle:
                    for chunk in response.iter_content(DOWNLOAD_CHUNK_BYTES):
                        digest.update(chunk)
                        handle.write(chunk)
                os.replace(partial, destination)
                return digest.hexdigest()
            except (requests.ConnectionError, requests.Timeout,
                    requests.exceptions.ChunkedEncodingError) as exc:
                partial.unlink(missing_ok=True)
                if retry_number + 1 >= self.retry.max_attempts:
                    raise ServerUnavailable(f"download of {url} broke off: {exc}") from exc
                wait_s = self.retry.backoff_s(retry_number)
                logger.warning("download of %s broke off (%s); retrying in %.1f s", url, exc, wait_s)
                self.sleep(wait_s)
                retry_number += 1
            finally:
                response.close()


class AgentClient(HttpClient):
    """Calls of the agent protocol against one server."""

    api_prefix = API_PREFIX
    user_agent = "kiln-agent"
    error_classes = {401: AgentUnauthorized, 409: StaleAttempt}

    # -- the protocol --------------------------------------------------------------------------

    def register(
        self, *, registration_token: str, name: str, labels: dict, capabilities: dict
    ) -> dict:
        body = {
            "registration_token": registration_token,
            "name": name,
            "labels": labels,
            "capabilities": capabilities,
        }
        return self._json(self.request("POST", "register", json=body, authenticated=False))

    def heartbeat(self, *, capabilities: dict, running_task: int | None) -> dict:
        body = {"capabilities": capabilities, "running_task": running_task}
        return self._json(self.request("POST", "heartbeat", json=body))

    def lease(self, *, wait_s: float) -> dict | None:
        """A task, or None when the server had none within `wait_s` (204)."""
        response = self.request(
            "POST", "tasks/lease", json={"wait_s": wait_s}, read_timeout_s=wait_s + self.timeout_s
        )
        if response.status_code == 204:
            return None
        return self._json(response)

    def progress(
        self, task_id: int, *, attempt: int, stage: str, message: str = "", percent: float | None = None
    ) -> dict:
        body = {"attempt": attempt, "stage": stage, "message": message, "percent": percent}
        return self._json(self.request("POST", f"tasks/{task_id}/progress", json=body))

    def upload_artifact(self, task_id: int, *, attempt: int, path: Path, progress=None) -> dict:
        """Send the compiled artifact, streamed from disk (an engine of gigabytes never sits in memory).

        The server says how: a presigned PUT straight to object storage (S3), or a resumable upload
        to itself, where a dropped connection costs only the bytes in flight.
        """
        from devices.agent.resumable import file_sha256, upload_file

        path = Path(path)
        sha256 = file_sha256(path)
        plan = self._json(self.request("POST", f"tasks/{task_id}/artifact-upload", json={
            "attempt": attempt, "sha256": sha256, "size_bytes": path.stat().st_size, "filename": path.name}))
        if plan.get("method") == "PUT":
            self.put_presigned(plan["url"], path, headers=plan.get("headers") or {})
            body = {"attempt": attempt, "staged": plan["staged"], "filename": path.name}
        else:
            upload = upload_file(self, path, create_path="uploads", progress=progress, sha256=sha256)
            body = {"attempt": attempt, "upload": upload["id"], "filename": path.name}
        return self._json(self.request("POST", f"tasks/{task_id}/artifact", json=body))

    def put_presigned(self, url: str, path: Path, *, headers: dict) -> None:
        """PUT a file to a presigned storage URL, streamed, retried like any call (without the agent token)."""
        handles = []

        def body():
            handle = open(path, "rb")  # noqa: SIM115 - closed below, after the last try
            handles.append(handle)
            return handle, "application/octet-stream"

        try:
            self.request("PUT", url, body_factory=body, headers=headers, authenticated=False,
                         read_timeout_s=max(self.timeout_s, 300.0))
        finally:
            for handle in handles:
                handle.close()

    def result(self, task_id: int, payload: dict) -> dict:
        return self._json(self.request("POST", f"tasks/{task_id}/result", json=payload))
