"""Per-organization and per-host limits on host work, what a job waiting for them says, and uploads over the limit."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from kiln.pipeline import waiting
from kiln.pipeline.admission import run_in_slot
from kiln.pipeline.capacity import Refused, slot_acquire, slot_held, slot_release, slots_expire
from kiln.pipeline.models import DeploymentJob, JobEvent, JobStatus, Variant, VariantStatus, WorkSlot
from kiln.registry.models import Model
from tests.conftest import make_tenant, upload
from workers.routing import BUILD, CHECK

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def eager(settings, tmp_path):
    settings.BLOB_ROOT = tmp_path / "blobs"
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.BUILDS_PER_ORGANIZATION = 1
    settings.CHECKS_PER_ORGANIZATION = 1
    settings.SANDBOXES_PER_HOST = 2


@pytest.fixture
def job(tenant, model_files) -> DeploymentJob:
    version = upload(tenant.client, "/api/v1/models/", model_files["model"]).json()["versions"][0]["id"]
    job_id = tenant.client.post("/api/v1/jobs/", {"model_version": version, "precisions": ["fp32", "int8-dynamic"]}, format="json").json()["id"]
    return DeploymentJob.objects.get(pk=job_id)


def build_waiting(job: DeploymentJob, *, seconds_ago: float = 0.0) -> Variant:
    """One of the job's builds sent to the build queue and not yet started."""
    variant = job.variants.first()
    offered = timezone.now() - timedelta(seconds=seconds_ago)
    Variant.objects.filter(pk=variant.pk).update(status=VariantStatus.PENDING, build_lease_owner="", build_offered_at=offered,
                                                 build_lease_expires_at=offered + timedelta(minutes=15))
    DeploymentJob.objects.filter(pk=job.pk).update(stage="quantize", status=JobStatus.RUNNING)
    return variant


def test_an_organization_alone_uses_every_build_slot_but_not_while_another_waits(tenant, other_tenant, model_files):
    first = slot_acquire(organization_id=tenant.organization.id, work_class=BUILD, holder="job 1: variant 1")
    second = slot_acquire(organization_id=tenant.organization.id, work_class=BUILD, holder="job 1: variant 2")
    assert isinstance(first, WorkSlot) and isinstance(second, WorkSlot)  # nobody else waits: no limit applies
    slot_release(second)
    version = upload(other_tenant.client, "/api/v1/models/", model_files["model"]).json()["versions"][0]["id"]
    other_job = DeploymentJob.objects.get(pk=other_tenant.client.post("/api/v1/jobs/", {"model_version": version, "precisions": ["fp32"]},
                                                                      format="json").json()["id"])
    build_waiting(other_job)
    refused = slot_acquire(organization_id=tenant.organization.id, work_class=BUILD, holder="job 1: variant 2")
    assert isinstance(refused, Refused) and refused.scope == "organization"
    assert "KILN_BUILDS_PER_ORGANIZATION=1" in refused.message
    assert isinstance(slot_acquire(organization_id=other_tenant.organization.id, work_class=BUILD, holder="job 2"), WorkSlot)


def test_checks_are_limited_per_organization_and_per_host(tenant, other_tenant, db):
    third = make_tenant(username="carol", organization="Third")
    assert isinstance(slot_acquire(organization_id=tenant.organization.id, work_class=CHECK, holder="upload a"), WorkSlot)
    refused = slot_acquire(organization_id=tenant.organization.id, work_class=CHECK, holder="upload b")
    assert isinstance(refused, Refused) and refused.scope == "organization" and "KILN_CHECKS_PER_ORGANIZATION=1" in refused.message
    assert isinstance(slot_acquire(organization_id=other_tenant.organization.id, work_class=CHECK, holder="upload c"), WorkSlot)
    host = slot_acquire(organization_id=third.organization.id, work_class=CHECK, holder="upload d")
    assert isinstance(host, Refused) and host.scope == "host" and "KILN_SANDBOXES_PER_HOST=2" in host.message


def test_a_slot_is_freed_when_its_work_ends_even_by_an_error_and_an_abandoned_one_expires(tenant):
    with pytest.raises(RuntimeError), slot_held(organization_id=tenant.organization.id, work_class=CHECK, holder="upload a"):
        raise RuntimeError("the sandbox was killed at its memory limit")
    assert WorkSlot.objects.count() == 0
    abandoned = slot_acquire(organization_id=tenant.organization.id, work_class=CHECK, holder="upload b")
    WorkSlot.objects.filter(pk=abandoned.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert isinstance(slot_acquire(organization_id=tenant.organization.id, work_class=CHECK, holder="upload c"), WorkSlot)
    assert slots_expire() == 1


def test_an_upload_over_the_organizations_check_limit_is_a_429_that_names_it_and_keeps_nothing(tenant, model_files):
    held = slot_acquire(organization_id=tenant.organization.id, work_class=CHECK, holder="another upload")
    response = upload(tenant.client, "/api/v1/models/", model_files["model"])
    assert response.status_code == 429, response.content
    body = response.json()
    assert "KILN_CHECKS_PER_ORGANIZATION=1" in body["error"] and body["code"] == "limit_reached", body
    assert Model.objects.count() == 0
    slot_release(held)
    assert upload(tenant.client, "/api/v1/models/", model_files["model"]).status_code == 201
    assert WorkSlot.objects.count() == 0


class RefusedTask:
    """Stands in for the bound Celery task only to record the retry it asks for (a real worker re-publishes it)."""

    def __init__(self):
        self.retries: list[dict] = []

    def retry(self, **options):
        self.retries.append(options)
        return RuntimeError("retried")


def test_a_task_refused_by_a_limit_goes_back_on_its_queue_and_its_job_says_why(job, other_tenant, settings):
    held = slot_acquire(organization_id=job.organization_id, work_class=CHECK, holder="an upload")
    task, ran = RefusedTask(), []
    with pytest.raises(RuntimeError, match="retried"):
        run_in_slot(task, organization_id=job.organization_id, work_class=CHECK, holder="job: support", job_id=job.id,
                    run=lambda: ran.append(1))
    assert ran == [] and task.retries == [{"countdown": settings.ADMISSION_RETRY_SECONDS, "max_retries": None}]
    job.refresh_from_db()
    said = waiting.job_waiting(job)
    assert said["cause"] == waiting.ORGANIZATION_LIMIT and "KILN_CHECKS_PER_ORGANIZATION=1" in said["message"]
    assert JobEvent.objects.filter(job=job, message__startswith="Waiting: your organization already runs 1 model checks").exists()
    slot_release(held)
    run_in_slot(task, organization_id=job.organization_id, work_class=CHECK, holder="job: support", job_id=job.id, run=lambda: ran.append(1))
    job.refresh_from_db()
    assert ran == [1] and job.waiting.get("cause") is None


def test_a_job_waiting_for_a_build_slot_says_how_many_jobs_are_ahead(job, tenant, model_files):
    version = upload(tenant.client, "/api/v1/models/", model_files["model"]).json()["versions"][0]["id"]
    later = DeploymentJob.objects.get(pk=tenant.client.post("/api/v1/jobs/", {"model_version": version, "precisions": ["fp32"]},
                                                            format="json").json()["id"])
    build_waiting(job, seconds_ago=30)
    build_waiting(later, seconds_ago=5)
    said = tenant.client.get(f"/api/v1/jobs/{later.id}/").json()["waiting"]
    assert said["cause"] == "build_slot" and said["position"] == 1
    assert said["message"] == "waiting for a build slot: 1 job ahead (1 build)"
    first = tenant.client.get(f"/api/v1/jobs/{job.id}/").json()["waiting"]
    assert first["position"] == 0 and first["message"].startswith("waiting for a build slot: 0 jobs ahead")
    listed = {row["id"]: row["waiting"] for row in tenant.client.get("/api/v1/jobs/").json()["results"]}
    assert listed[later.id] == said


def test_a_paused_build_is_said_once_as_an_event_and_shown_while_it_lasts(job):
    for _ in range(3):
        waiting.job_wait_note(job_id=job.id, cause=waiting.BUILDS_PAUSED, message="builds paused while local times job 7")
        waiting.job_wait_clear(job_id=job.id, cause=waiting.BUILDS_PAUSED)
    waiting.job_wait_note(job_id=job.id, cause=waiting.BUILDS_PAUSED, message="builds paused while local times job 7")
    job.refresh_from_db()
    DeploymentJob.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING)
    job.refresh_from_db()
    assert waiting.job_waiting(job)["message"] == "builds paused while local times job 7"
    assert JobEvent.objects.filter(job=job, message="Waiting: builds paused while local times job 7.").count() == 1
