"""The retrying HTTP base of the Kiln server's clients: the agent's (`devices.agent.client`) and `kiln_client.Client`.

`HttpClient` retries only what may succeed on a second try: connection errors and timeouts, 429 and 5xx,
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

DOWNLOAD_CHUNK_BYTES = 1 << 20


class ApiError(Exception):
    """The server answered a request with an error that retrying will not fix."""

    def __init__(self, status: int, message: str, code: str | None = None, details=None):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.code = code
        self.details = details or {}


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
