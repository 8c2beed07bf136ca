"""Server-sent events of a job: the job as JSON on every change, ending when the job ends; tenant-scoped."""
from __future__ import annotations

import json

import pytest

from kiln.pipeline.api.views import job_event_stream
from kiln.pipeline.models import DeploymentJob
from kiln.pipeline.services import job_cancel
from tests.conftest import upload

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(tenant, model_files, settings, tmp_path):
    settings.BLOB_ROOT = tmp_path / "blobs"
    version = upload(tenant.client, "/api/v1/models/", model_files["model"]).json()["versions"][0]["id"]
    # Without eager Celery or a worker the job stays queued: a stream has something to wait on.
    return DeploymentJob.objects.get(pk=tenant.client.post("/api/v1/jobs/", {"model_version": version, "precisions": ["fp32"]}, format="json").json()["id"])


def events(chunks) -> list[dict]:
    return [json.loads(chunk.split("data: ", 1)[1]) for chunk in chunks if chunk.startswith("event: job")]


def test_the_stream_sends_the_job_then_each_change_and_ends_with_it(tenant, job):
    stream = job_event_stream(organization=tenant.organization, job_id=job.id, poll_s=0.01, max_s=30)
    assert next(stream).startswith("retry:")
    first = events([next(stream)])[0]
    assert first["id"] == job.id and first["status"] == "queued" and "device_tasks" in first
    job_cancel(job=job)
    rest = events(list(stream))
    assert rest[-1]["status"] == "canceled"


def test_a_quiet_stream_ends_after_its_time_so_the_browser_reconnects(tenant, job):
    chunks = list(job_event_stream(organization=tenant.organization, job_id=job.id, poll_s=0.01, max_s=0.05))
    assert len(events(chunks)) == 1


def test_the_route_is_an_event_stream_and_tenant_scoped(tenant, other_tenant, job):
    job_cancel(job=job)
    # What EventSource sends: content negotiation must let it through.
    response = tenant.client.get(f"/api/v1/jobs/{job.id}/stream/", HTTP_ACCEPT="text/event-stream")
    assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"
    body = b"".join(response.streaming_content).decode()
    assert events(body.split("\n\n"))[0]["status"] == "canceled"
    refused = other_tenant.client.get(f"/api/v1/jobs/{job.id}/stream/", HTTP_ACCEPT="text/event-stream")
    assert refused.status_code == 404 and json.loads(refused.content)["code"] == "not_found"
