"""`/metrics`: Prometheus text behind KILN_METRICS (and KILN_METRICS_TOKEN), with the fleet's state from the database."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from kiln.fleet.models import Agent
from kiln.pipeline.models import DeploymentJob, JobStatus
from tests.conftest import upload

pytestmark = pytest.mark.django_db


def test_metrics_are_off_unless_enabled(settings):
    settings.METRICS = False
    assert Client().get("/metrics").status_code == 404


def test_metrics_token_is_required_when_set(settings):
    settings.METRICS, settings.METRICS_TOKEN = True, "s3cret-scrape-token"
    assert Client().get("/metrics").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token").status_code == 200


def test_metrics_show_queue_depth_agents_and_job_durations(settings, tenant, model_files, tmp_path):
    settings.METRICS, settings.METRICS_TOKEN, settings.BLOB_ROOT = True, "", tmp_path / "blobs"
    version = upload(tenant.client, "/api/v1/models/", model_files["model"]).json()["versions"][0]["id"]
    for _ in range(2):
        tenant.client.post("/api/v1/jobs/", {"model_version": version, "precisions": ["fp32"]}, format="json")
    finished = DeploymentJob.objects.first()
    DeploymentJob.objects.filter(pk=finished.pk).update(status=JobStatus.SUCCEEDED, stage="done", finished_at=finished.created_at + timedelta(seconds=45))
    Agent.objects.create(organization=tenant.organization, name="on", lookup_prefix="a", digest="a" * 64, last_heartbeat_at=timezone.now())
    Agent.objects.create(organization=tenant.organization, name="off", lookup_prefix="b", digest="b" * 64, last_heartbeat_at=timezone.now() - timedelta(hours=1))

    response = Client().get("/metrics")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    assert 'kiln_jobs{stage="validate",status="queued"} 1.0' in text
    assert 'kiln_jobs{stage="done",status="succeeded"} 1.0' in text
    assert "kiln_agents_online 1.0" in text
    assert 'kiln_job_duration_seconds_bucket{le="30.0"} 0.0' in text and 'kiln_job_duration_seconds_bucket{le="60.0"} 1.0' in text
    assert "kiln_job_duration_seconds_sum 45.0" in text
    assert "kiln_agent_lease_waiting" in text and "kiln_http_request_duration_seconds" in text


def test_metrics_count_the_database_queries_of_the_server(settings, tenant):
    settings.METRICS, settings.METRICS_TOKEN = True, ""

    def queries() -> float:
        text = Client().get("/metrics").content.decode()
        return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith("kiln_db_queries_total "))

    before = queries()
    for _ in range(3):
        assert tenant.client.get("/api/v1/jobs/").status_code == 200
    # Three job lists (a few queries each) and the scrape's own fleet gauges.
    assert queries() - before >= 3
