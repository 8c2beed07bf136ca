"""Work leases and the stuck-work reaper: a stage or variant build whose worker died is sent again
(once, by one of several reapers), a duplicate delivery while the work runs does nothing, and after
the last attempt the variant fails without failing the job."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import Q
from django.utils import timezone

from kiln.pipeline.leases import BUILD, STAGE, lease_claim, variant_build_leased
from kiln.pipeline.models import Artifact, ArtifactKind, DeploymentJob, JobEvent, JobStatus, Variant, VariantStatus
from kiln.pipeline.reaper import _reap_build, work_reap_expired
from tests.conftest import upload
from workers.tasks import reap_stuck_work

# Transactional: leases are renewed from a side thread, which must see committed rows.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def eager(settings, tmp_path):
    settings.BLOB_ROOT = tmp_path / "blobs"
    settings.CELERY_TASK_ALWAYS_EAGER = True


@pytest.fixture
def job(tenant, model_files) -> DeploymentJob:
    """A job whose variants were built; no agent, so it waits for devices."""
    version = upload(tenant.client, "/api/v1/models/", model_files["model"]).json()["versions"][0]["id"]
    job_id = tenant.client.post("/api/v1/jobs/", {"model_version": version, "precisions": ["fp32", "int8-dynamic"]}, format="json").json()["id"]
    job = DeploymentJob.objects.get(pk=job_id)
    assert job.status == JobStatus.WAITING_FOR_DEVICES
    assert job.stage_lease_expires_at is None and job.stage_lease_owner == ""
    return job


def die_mid_build(job: DeploymentJob, *, attempts: int = 1) -> Variant:
    """The state a kill -9 of the worker leaves: the job in quantize, one variant building under a lease nobody renews."""
    DeploymentJob.objects.filter(pk=job.pk).update(stage="quantize", status=JobStatus.RUNNING)
    variant = job.variants.get(precision="int8-dynamic")
    Artifact.objects.filter(pk=variant.artifact_id).delete()
    Variant.objects.filter(pk=variant.pk).update(
        status=VariantStatus.BUILDING, artifact=None, build_lease_owner="dead-worker",
        build_lease_expires_at=timezone.now() - timedelta(seconds=1), build_attempts=attempts,
    )
    return Variant.objects.get(pk=variant.pk)


def test_a_build_whose_worker_died_is_sent_again_and_built_exactly_once(job):
    variant = die_mid_build(job)
    assert reap_stuck_work.apply().get() == 1
    variant.refresh_from_db()
    assert variant.status == VariantStatus.READY and variant.build_lease_owner == "" and variant.build_attempts == 2
    assert Artifact.objects.filter(job=job, kind=ArtifactKind.VARIANT, name__startswith=variant.key).count() == 1
    assert JobEvent.objects.filter(job=job, message__contains=f"build of {variant.key} was sent again").count() == 1
    # The job went on from where the build stopped: dispatched, and waiting for a device again.
    assert DeploymentJob.objects.get(pk=job.pk).status == JobStatus.WAITING_FOR_DEVICES
    assert work_reap_expired() == 0


def test_two_reapers_seeing_the_same_dead_build_send_it_once(job, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = False  # keep the re-sent build in the broker
    variant = die_mid_build(job)
    assert _reap_build(variant) == 1
    assert _reap_build(variant) == 0  # the second host's snapshot no longer matches the row
    assert JobEvent.objects.filter(job=job, message__contains="sent again").count() == 1


def test_a_duplicate_delivery_while_the_build_runs_does_nothing(job):
    variant = job.variants.get(precision="fp32")
    Variant.objects.filter(pk=variant.pk).update(status=VariantStatus.BUILDING)
    assert lease_claim(BUILD, variant.pk) is not None  # a live worker holds it
    built = []

    def build(*, variant_id: int) -> None:
        built.append(variant_id)

    assert variant_build_leased(variant_id=variant.pk, work=build) is False
    assert built == []


def test_after_the_last_attempt_the_variant_fails_and_the_job_goes_on(job, settings):
    variant = die_mid_build(job, attempts=settings.WORK_MAX_ATTEMPTS)
    assert work_reap_expired() == 1
    variant.refresh_from_db()
    assert variant.status == VariantStatus.FAILED and "stopped 3 times" in variant.error
    assert DeploymentJob.objects.get(pk=job.pk).status == JobStatus.WAITING_FOR_DEVICES  # fp32 still goes to devices


def test_a_stage_message_that_was_lost_is_sent_again(job, settings):
    # The dispatch message vanished (a broker restarted without persistence): offered, never claimed.
    DeploymentJob.objects.filter(pk=job.pk).update(
        stage="dispatch", status=JobStatus.RUNNING, stage_task="dispatch", stage_lease_owner="",
        stage_lease_expires_at=timezone.now() - timedelta(seconds=1),
    )
    assert work_reap_expired() == 1
    job.refresh_from_db()
    assert job.status == JobStatus.WAITING_FOR_DEVICES and job.stage_lease_expires_at is None
    assert JobEvent.objects.filter(job=job, message__contains="dispatch task was sent again: it was never picked up").exists()


def test_a_stray_message_of_another_stage_claims_nothing(job):
    DeploymentJob.objects.filter(pk=job.pk).update(stage_task="report", stage_lease_owner="", stage_lease_expires_at=timezone.now() + timedelta(minutes=5))
    assert lease_claim(STAGE, job.pk, stage_match("convert")) is None
    assert lease_claim(STAGE, job.pk, stage_match("report")) is not None


def stage_match(stage: str) -> Q:
    return Q(stage_task=stage) | Q(stage_task="")


