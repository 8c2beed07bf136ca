"""The stuck-work reaper (Celery beat): host-side work whose lease expired is sent again or failed.

A lease expires when the worker running a stage or a variant build died (kill -9, out of memory,
a lost host), or when a sent task was never claimed (its message was lost). Each row is taken by
a compare-and-set on the lease it was seen with, so reapers on several hosts act once between them.
A task never claimed while the workers of its class are busy is waiting its turn, not lost: it gets
another grace instead of a second message.
"""
from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from workers.routing import BUILD, work_class_of

from .leases import BUILD as BUILD_LEASE
from .leases import STAGE, lease_offer_extend
from .models import TERMINAL_JOB_STATUSES, DeploymentJob, Variant, VariantStatus
from .quantize import quantize_finish_if_done
from .queue import STAGE_TASK_NAMES, enqueue_stage, enqueue_variant_build
from .services import job_event_add, job_fail
from .waiting import class_busy

logger = logging.getLogger(__name__)


def work_reap_expired() -> int:
    """Send again (or fail, after the last attempt) every stage and build whose lease expired."""
    now = timezone.now()
    active = DeploymentJob.objects.exclude(status__in=TERMINAL_JOB_STATUSES)
    reaped = sum(_reap_stage(job) for job in active.filter(stage_lease_expires_at__lt=now))
    builds = Variant.objects.filter(build_lease_expires_at__lt=now, status__in=[VariantStatus.PENDING, VariantStatus.BUILDING])
    reaped += sum(_reap_build(variant) for variant in builds.exclude(job__status__in=TERMINAL_JOB_STATUSES).select_related("job"))
    return reaped


def _reap_stage(job: DeploymentJob) -> int:
    if not job.stage_lease_owner and class_busy(work_class_of(STAGE_TASK_NAMES.get(job.stage_task, ""))):
        return lease_offer_extend(STAGE, job.pk) and 0
    seen = DeploymentJob.objects.filter(pk=job.pk, stage_lease_owner=job.stage_lease_owner, stage_lease_expires_at=job.stage_lease_expires_at)
    with transaction.atomic():
        if not seen.update(stage_lease_owner="", stage_lease_expires_at=None):
            return 0  # renewed, claimed or reaped elsewhere meanwhile
        if job.stage_attempts >= settings.WORK_MAX_ATTEMPTS:
            job_fail(job=job, stage=job.stage, message=f"The worker running the {job.stage_task} task stopped {job.stage_attempts} times; giving up.")
            return 1
        what = "its worker stopped answering" if job.stage_lease_owner else "it was never picked up"
        job_event_add(job=job, stage=job.stage, level="warning", message=f"The {job.stage_task} task was sent again: {what}.")
        enqueue_stage(job_id=job.pk, stage=job.stage_task, resend=True)
    return 1


def _reap_build(variant: Variant) -> int:
    if not variant.build_lease_owner and class_busy(BUILD):
        return lease_offer_extend(BUILD_LEASE, variant.pk) and 0
    seen = Variant.objects.filter(pk=variant.pk, build_lease_owner=variant.build_lease_owner, build_lease_expires_at=variant.build_lease_expires_at)
    with transaction.atomic():
        if variant.build_attempts >= settings.WORK_MAX_ATTEMPTS:
            error = f"The worker building it stopped {variant.build_attempts} times."
            if not seen.update(build_lease_owner="", build_lease_expires_at=None, status=VariantStatus.FAILED, error=error):
                return 0
            job_event_add(job=variant.job, stage="quantize", level="error", message=f"{variant.key} failed: {error}")
            quantize_finish_if_done(job_id=variant.job_id)
            return 1
        if not seen.update(build_lease_owner="", build_lease_expires_at=None):
            return 0
        what = "its worker stopped answering" if variant.build_lease_owner else "it was never picked up"
        job_event_add(job=variant.job, stage="quantize", level="warning", message=f"The build of {variant.key} was sent again: {what}.")
        enqueue_variant_build(variant_id=variant.pk, resend=True)
    return 1
