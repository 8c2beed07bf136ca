"""The agent protocol (`/api/agent/v1/`) over the retrying HTTP base (`kiln_contract.http`)."""

from __future__ import annotations

from pathlib import Path

from kiln_contract.http import ApiError, HttpClient, RetryPolicy, ServerUnavailable
from kiln_contract.resumable import file_sha256, upload_file

# The agent's callers catch the base's errors through this module too.
__all__ = ["AgentClient", "AgentUnauthorized", "ApiError", "HttpClient", "RetryPolicy", "ServerUnavailable", "StaleAttempt"]

API_PREFIX = "/api/agent/v1/"


INTERVAL_HEADERS = {"Kiln-Long-Poll": "long_poll_s", "Kiln-Heartbeat-Interval": "heartbeat_interval_s",
                    "Kiln-Poll-Interval": "poll_interval_s"}


def intervals_from_headers(headers) -> dict[str, float]:
    """The server's intervals from a lease answer's headers; a missing or malformed one is left out."""
    found = {}
    for header, key in INTERVAL_HEADERS.items():
        try:
            value = float(headers.get(header) or "")
        except ValueError:
            continue
        if 0 < value <= 3600:
            found[key] = value
    return found


class AgentUnauthorized(ApiError):
    """401: the agent or registration token is wrong or revoked; the agent must stop."""


class StaleAttempt(ApiError):
    """409: this attempt of the task is no longer ours; drop the task."""


class AgentClient(HttpClient):
    """Calls of the agent protocol against one server."""

    api_prefix = API_PREFIX
    user_agent = "kiln-agent"
    error_classes = {401: AgentUnauthorized, 409: StaleAttempt}
    # The intervals the last lease answer announced (heartbeat_interval_s, poll_interval_s, long_poll_s).
    intervals: dict[str, float] = {}

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
        """A task, or None when the server had none within `wait_s` (204).

        The answer's headers carry the server's intervals (`self.intervals`): an idle agent's
        long-poll is its heartbeat, so it learns them here.
        """
        response = self.request(
            "POST", "tasks/lease", json={"wait_s": wait_s}, read_timeout_s=wait_s + self.timeout_s
        )
        self.intervals = intervals_from_headers(response.headers)
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
