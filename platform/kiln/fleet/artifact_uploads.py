"""Engines sent straight to S3: the server signs a PUT for one staged object, then verifies and keeps it.

With the local folder there is nothing to sign and agents use the resumable uploads instead.
"""
from __future__ import annotations

from django.conf import settings
from django.core import signing

from kiln.core.errors import Conflict, KilnError, upload_too_large
from kiln.pipeline.models import Artifact, DeviceTaskStatus
from kiln.registry import storage
from kiln.registry.services import UPLOAD_LIFETIME, blob_create_staged, storage_quota_check

from .models import Agent
from .services import device_task_for_agent, device_task_store_artifact

STAGED_SALT = "kiln.fleet.staged-artifact"


def device_task_artifact_upload_plan(*, agent: Agent, task_id: int, attempt: int, sha256: str, size_bytes: int, filename: str = "") -> dict:
    """How the agent holding this attempt sends its engine: `{"method": "resumable"}` or a presigned PUT and its token."""
    task = device_task_for_agent(agent=agent, task_id=task_id, attempt=attempt)
    if task.status != DeviceTaskStatus.LEASED:
        raise Conflict("The task is no longer leased.", code="not_leased")
    if size_bytes > settings.MAX_UPLOAD_BYTES:
        raise upload_too_large()
    storage_quota_check(organization=agent.organization, adding_bytes=size_bytes, what="This engine")
    if storage.is_local():
        return {"method": "resumable"}
    key = storage.incoming_key(f"task{task.id}-attempt{attempt}")
    claim = {"agent": agent.id, "task": task.id, "attempt": attempt, "key": key, "sha256": sha256, "size_bytes": size_bytes}
    return {**storage.presigned_upload(key, sha256=sha256, size_bytes=size_bytes), "staged": signing.dumps(claim, salt=STAGED_SALT)}


def _staged_claim(*, agent: Agent, task_id: int, attempt: int, staged: str) -> dict:
    try:
        claim = signing.loads(staged, salt=STAGED_SALT, max_age=UPLOAD_LIFETIME)
    except signing.BadSignature:
        raise KilnError("The staged upload token is not valid (or expired); ask artifact-upload for a new one.", code="invalid_staged_token") from None
    if (claim.get("agent"), claim.get("task"), claim.get("attempt")) != (agent.id, task_id, attempt):
        raise KilnError("The staged upload token belongs to another task or attempt.", code="invalid_staged_token")
    return claim


def device_task_store_staged_artifact(*, agent: Agent, task_id: int, attempt: int, staged: str, filename: str) -> Artifact:
    """Keep the engine the agent put in storage: checked (size, sha256) and copied under its digest inside the storage."""
    claim = _staged_claim(agent=agent, task_id=task_id, attempt=attempt, staged=staged)

    def verified_blob():
        return blob_create_staged(organization=agent.organization, key=claim["key"], sha256=claim["sha256"], size_bytes=claim["size_bytes"])

    return device_task_store_artifact(agent=agent, task_id=task_id, attempt=attempt, filename=filename, blob_from=verified_blob)
