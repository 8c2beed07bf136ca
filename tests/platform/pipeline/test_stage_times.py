"""A stage that runs once per search round reports the time of every round, not only the last."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from kiln.pipeline.models import DeploymentJob
from kiln.pipeline.services import job_stage_finish, job_stage_start
from tests.conftest import upload

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def eager(settings, tmp_path):
    settings.BLOB_ROOT = tmp_path / "blobs"
    settings.CELERY_TASK_ALWAYS_EAGER = True


def test_quantize_time_adds_up_over_rounds(tenant, model_files):
    version = upload(tenant.client, "/api/v1/models/", model_files["model"]).json()["versions"][0]["id"]
    job = DeploymentJob.objects.get(pk=tenant.client.post("/api/v1/jobs/", {"model_version": version, "precisions": ["fp32"]},
                                                          format="json").json()["id"])
    before = next(entry for entry in job.stages if entry["name"] == "quantize").get("seconds", 0.0)
    for round_seconds in (4.0, 6.0):
        job_stage_start(job=job, stage="quantize")
        entry = next(entry for entry in job.stages if entry["name"] == "quantize")
        entry["started_at"] = (timezone.now() - timedelta(seconds=round_seconds)).isoformat()
        job_stage_finish(job=job, stage="quantize", message="round")
    job.refresh_from_db()
    entry = next(entry for entry in job.stages if entry["name"] == "quantize")
    assert entry["seconds"] - before == pytest.approx(10.0, abs=0.5)
    assert entry["runs"] >= 2
    # The answer carries the totals for the job page.
    stages = tenant.client.get(f"/api/v1/jobs/{job.id}/").json()["stages"]
    assert next(stage for stage in stages if stage["name"] == "quantize")["seconds"] == entry["seconds"]
