"""Nothing a member or an agent uploads is left behind, and no organization can fill the disk: a
deleted or expired upload takes its blob with it (expiry runs on the beat schedule for every
organization), an agent's upload survives a refused artifact post for a retry, and every upload and
job is checked against the organization's storage quota (KILN_STORAGE_QUOTA_BYTES)."""
from __future__ import annotations

import base64
import hashlib
import os
import time
from datetime import timedelta

import numpy as np
import pytest
from django.utils import timezone

from kiln.registry import storage, uploads
from kiln.registry.models import Blob, Upload
from kiln.registry.services import uploads_expire
from tests.conftest import make_tenant, upload
from tests.platform.security.conftest import assert_json_error

pytestmark = pytest.mark.django_db

TUS = {"HTTP_TUS_RESUMABLE": "1.0.0"}


@pytest.fixture(autouse=True)
def private_uploads(settings, tmp_path):
    settings.UPLOAD_TMP_DIR = tmp_path / "uploads"


def finished_upload(client, data: bytes, base: str = "/api/v1/uploads/") -> dict:
    meta = f"filename {base64.b64encode(b'engine.bin').decode()},sha256 {base64.b64encode(hashlib.sha256(data).hexdigest().encode()).decode()}"
    created = client.post(base, HTTP_UPLOAD_LENGTH=str(len(data)), HTTP_UPLOAD_METADATA=meta, **TUS)
    assert created.status_code == 201, created.content
    url = created["Location"]
    sent = client.generic("PATCH", url, data, content_type="application/offset+octet-stream", HTTP_UPLOAD_OFFSET="0", **TUS)
    assert sent.status_code == 204, sent.content
    return {**created.json(), "url": url, "sha256": hashlib.sha256(data).hexdigest()}


def test_deleting_a_finished_upload_removes_its_blob(tenant, django_capture_on_commit_callbacks):
    done = finished_upload(tenant.client, b"a finished upload nobody used")
    assert Blob.objects.filter(sha256=done["sha256"]).exists() and storage.blob_exists(done["sha256"])
    with django_capture_on_commit_callbacks(execute=True):
        assert tenant.client.delete(done["url"], **TUS).status_code == 204
    assert not Upload.objects.exists()
    assert not Blob.objects.exists()
    assert not storage.blob_exists(done["sha256"])


def test_deleting_a_finished_upload_keeps_bytes_a_dataset_uses(tenant, model_files, django_capture_on_commit_callbacks):
    data = model_files["calibration"].read_bytes()
    upload(tenant.client, "/api/v1/datasets/", model_files["calibration"], kind="calibration")
    done = finished_upload(tenant.client, data)
    with django_capture_on_commit_callbacks(execute=True):
        assert tenant.client.delete(done["url"], **TUS).status_code == 204
    assert Blob.objects.filter(sha256=done["sha256"]).count() == 1 and storage.blob_exists(done["sha256"])


def test_expired_uploads_of_every_organization_go_without_anyone_opening_another(tenant, other_tenant, django_capture_on_commit_callbacks):
    mine = finished_upload(tenant.client, b"finished, never used")
    theirs = other_tenant.client.post("/api/v1/uploads/", HTTP_UPLOAD_LENGTH="100", **TUS).json()
    half = tenant.client.post("/api/v1/uploads/", HTTP_UPLOAD_LENGTH="8", **TUS)
    tenant.client.generic("PATCH", half["Location"], b"abcd", content_type="application/offset+octet-stream", HTTP_UPLOAD_OFFSET="0", **TUS)
    fresh = tenant.client.post("/api/v1/uploads/", HTTP_UPLOAD_LENGTH="8", **TUS).json()
    Upload.objects.exclude(pk=fresh["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    part = uploads.part_path(half.json()["id"])
    assert part.exists()
    with django_capture_on_commit_callbacks(execute=True):
        assert uploads_expire() == 3
    assert [str(pk) for pk in Upload.objects.values_list("pk", flat=True)] == [fresh["id"]]
    assert not Blob.objects.exists() and not storage.blob_exists(mine["sha256"])
    assert not part.exists() and not Upload.objects.filter(pk=theirs["id"]).exists()
    assert uploads_expire() == 0  # idempotent


def test_a_part_file_left_without_its_upload_goes_after_a_day(tenant):
    orphan = uploads.part_path("0b7c2a1e-0000-4000-8000-000000000000")
    recent = uploads.part_path("0b7c2a1e-0000-4000-8000-000000000001")
    orphan.parent.mkdir(parents=True, exist_ok=True)
    orphan.write_bytes(b"left behind")
    recent.write_bytes(b"being written")
    old = time.time() - 2 * 24 * 3600
    os.utime(orphan, (old, old))
    uploads_expire()
    assert not orphan.exists() and recent.exists()


def test_expiry_is_on_the_beat_schedule():
    from workers.celery import app

    entries = {entry["task"] for entry in app.conf.beat_schedule.values()}
    assert "kiln.housekeeping.expire_uploads" in entries


@pytest.mark.django_db(transaction=True)
def test_an_agent_s_upload_survives_a_post_for_a_task_it_does_not_hold(tenant, agent, leased_task):
    from tests.platform.security.conftest import register_agent

    other = register_agent(tenant, name="bystander")
    done = finished_upload(other, b"an engine", base="/api/agent/v1/uploads")
    refused = other.post(f"/api/agent/v1/tasks/{leased_task['id']}/artifact", {"attempt": leased_task["attempt"], "upload": done["id"]}, format="json")
    assert_json_error(refused, 409, "not_leased")
    missing = other.post("/api/agent/v1/tasks/999999/artifact", {"attempt": 1, "upload": done["id"]}, format="json")
    assert_json_error(missing, 404, "not_found")
    assert Upload.objects.filter(pk=done["id"], blob__isnull=False).exists()
    # The holder's own upload, posted for its task, becomes the artifact (and is consumed then).
    mine = finished_upload(agent, b"the holder's engine", base="/api/agent/v1/uploads")
    stale = agent.post(f"/api/agent/v1/tasks/{leased_task['id']}/artifact", {"attempt": leased_task["attempt"] + 1, "upload": mine["id"]}, format="json")
    assert_json_error(stale, 409, "stale_attempt")
    assert Upload.objects.filter(pk=mine["id"]).exists()
    kept = agent.post(f"/api/agent/v1/tasks/{leased_task['id']}/artifact", {"attempt": leased_task["attempt"], "upload": mine["id"]}, format="json")
    assert kept.status_code == 201, kept.content
    assert not Upload.objects.filter(pk=mine["id"]).exists()


def test_uploads_past_the_storage_quota_are_refused_with_the_numbers(tenant, other_tenant, settings, tmp_path):
    settings.STORAGE_QUOTA_BYTES = 10_000
    finished_upload(tenant.client, b"x" * 4000)
    started = tenant.client.post("/api/v1/uploads/", HTTP_UPLOAD_LENGTH="5000", **TUS)
    assert started.status_code == 201  # 9,000 of 10,000 now used (4,000 stored, 5,000 reserved)
    usage = tenant.client.get("/api/v1/storage/").json()
    assert usage == {"stored_bytes": 4000, "uploads_in_flight_bytes": 5000, "used_bytes": 9000, "quota_bytes": 10_000, "available_bytes": 1000}
    refused = tenant.client.post("/api/v1/uploads/", HTTP_UPLOAD_LENGTH="1001", **TUS)
    body = assert_json_error(refused, 413, "storage_quota_exceeded")
    assert "needs 1,001 bytes" in body["error"] and "uses 8.8 KB of its 9.8 KB" in body["error"] and "KILN_STORAGE_QUOTA_BYTES" in body["error"]
    assert body["details"] == {"needed_bytes": 1001, "used_bytes": 9000, "quota_bytes": 10_000, "available_bytes": 1000}
    # A multipart upload is counted too, and nothing of it is stored.
    path = tmp_path / "calibration.npz"
    np.savez(path, input=np.zeros((8, 64), np.float32))
    assert path.stat().st_size > 1000
    assert_json_error(upload(tenant.client, "/api/v1/datasets/", path, kind="calibration"), 413, "storage_quota_exceeded")
    assert Blob.objects.filter(organization=tenant.organization).count() == 1
    # Another organization has its own quota.
    assert other_tenant.client.post("/api/v1/uploads/", HTTP_UPLOAD_LENGTH="9000", **TUS).status_code == 201


def test_no_job_starts_once_the_organization_is_at_its_quota(tenant, model_files, settings):
    version = upload(tenant.client, "/api/v1/models/", model_files["model"]).json()["versions"][0]
    settings.STORAGE_QUOTA_BYTES = version["size_bytes"]
    body = assert_json_error(tenant.client.post("/api/v1/jobs/", {"model_version": version["id"], "precisions": ["fp32"]}, format="json"),
                             413, "storage_quota_exceeded")
    assert "A deployment job" not in body["error"] and "left" in body["error"]
    viewer = make_tenant(username="vera", organization="Acme", role="viewer")
    assert viewer.client.get("/api/v1/storage/").json()["available_bytes"] == 0
