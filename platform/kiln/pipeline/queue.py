"""Sending pipeline work to the Celery workers, by task name, once the transaction commits."""
from __future__ import annotations

import json
from collections import Counter

from django.db import transaction
from django.utils import timezone

from kiln.core import notify
from workers.celery import app
from workers.routing import BUILD as BUILD_CLASS
from workers.routing import priority_for, work_class_of

from .leases import BUILD, STAGE, lease_offer
from .models import TERMINAL_JOB_STATUSES, DeploymentJob, Variant, VariantStatus

# The names under which workers/tasks.py registers each task; the pipeline sends by name so that
# it never imports the task module (which imports the pipeline).
STAGE_TASK_NAMES = {
    "validate": "kiln.job.validate",
    "convert": "kiln.job.convert",
    "support": "kiln.job.support",
    "reference": "kiln.job.reference",
    "quantize": "kiln.job.quantize",
    "dispatch": "kiln.job.dispatch",
    "collect": "kiln.job.collect",
    "plan": "kiln.job.plan",
    "report": "kiln.job.report",
}
VARIANT_BUILD_TASK_NAME = "kiln.variant.build"
REDISPATCH_TASK_NAME = "kiln.housekeeping.redispatch_waiting"


def _send_on_commit(name: str, *args, priority: int = 0) -> None:
    # A signature resolves the task lazily, so eager mode (unit tests) runs it in-process; routing (its class's queue)
    # comes from the task's name (workers/routing.py).
    transaction.on_commit(lambda: app.signature(name, args=list(args)).apply_async(priority=priority))


def stages_of_class(work_class: str) -> list[str]:
    """The job stages whose task is work of the class (workers/routing.py)."""
    return [stage for stage, name in STAGE_TASK_NAMES.items() if work_class_of(name) == work_class]


def waiting_builds():
    """Variant builds sent and not started (an offered, unclaimed build lease) of jobs still going."""
    return Variant.objects.filter(status=VariantStatus.PENDING, build_lease_owner="", build_lease_expires_at__gt=timezone.now()).exclude(
        job__status__in=TERMINAL_JOB_STATUSES)


def waiting_stages(work_class: str):
    """Jobs whose stage task of the class was sent and not started."""
    return DeploymentJob.objects.filter(stage_task__in=stages_of_class(work_class), stage_lease_owner="",
                                        stage_lease_expires_at__gt=timezone.now()).exclude(status__in=TERMINAL_JOB_STATUSES)


def _waiting_builds(*, job_id: int | None = None, organization_id: int | None = None) -> int:
    """Build-class work sent and not started, of one job or of one organization (stages and variant builds)."""
    if job_id is not None:
        return waiting_builds().filter(job_id=job_id).count() + waiting_stages(BUILD_CLASS).filter(pk=job_id).count()
    return (waiting_builds().filter(organization_id=organization_id).count()
            + waiting_stages(BUILD_CLASS).filter(organization_id=organization_id).count())


def _priority(*, job_id: int, organization_id: int, exclude: int = 1) -> int:
    """The message's place among its queue's: behind what its own job and organization already have waiting (the work
    just offered, `exclude` of it, does not count against itself)."""
    return priority_for(job_builds_ahead=max(0, _waiting_builds(job_id=job_id) - exclude),
                        organization_builds_ahead=max(0, _waiting_builds(organization_id=organization_id) - exclude))


def enqueue_stage(*, job_id: int, stage: str, resend: bool = False) -> None:
    """Send a job's stage to the workers once the current transaction commits, under a work lease.

    `resend` (the reaper's) keeps counting the attempts of the stage sent before.
    """
    lease_offer(STAGE, job_id, resend=resend, stage_task=stage)
    priority = 0
    if work_class_of(STAGE_TASK_NAMES[stage]) == BUILD_CLASS:
        organization_id = DeploymentJob.objects.filter(pk=job_id).values_list("organization_id", flat=True).first()
        priority = _priority(job_id=job_id, organization_id=organization_id) if organization_id else 0
    _send_on_commit(STAGE_TASK_NAMES[stage], job_id, priority=priority)


def enqueue_variant_build(*, variant_id: int, resend: bool = False) -> None:
    lease_offer(BUILD, variant_id, resend=resend)
    owner = Variant.objects.filter(pk=variant_id).values_list("job_id", "organization_id").first()
    priority = _priority(job_id=owner[0], organization_id=owner[1]) if owner else 0
    _send_on_commit(VARIANT_BUILD_TASK_NAME, variant_id, priority=priority)


def lease_offers(tasks) -> list[dict]:
    """What newly leasable tasks offer to waiting agents: how many, for which backend, pinned agent and labels."""
    groups: Counter = Counter(
        (task.backend, task.pinned_agent_id, json.dumps(task.required_labels or {}, sort_keys=True)) for task in tasks
    )
    return [{"count": count, "backend": backend, "agent": agent_id, "labels": json.loads(labels)}
            for (backend, agent_id, labels), count in groups.items()]


def wake_agents(*, organization_id: int, tasks=None) -> None:
    """Wake waiting agents of the organization once the transaction commits: as many as `tasks` are
    newly leasable, and only agents that can run them; every waiting agent when `tasks` is None."""
    channel = notify.organization_channel(organization_id)
    offers = lease_offers(tasks) if tasks is not None else [None]

    def publish():
        for offer in offers:
            notify.publish(channel, offer)

    transaction.on_commit(publish)
