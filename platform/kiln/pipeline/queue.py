"""Sending pipeline work to the Celery workers, by task name, once the transaction commits."""
from __future__ import annotations

import json
from collections import Counter

from django.db import transaction

from kiln.core import notify
from workers.celery import app

from .leases import BUILD, STAGE, lease_offer

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
    "report": "kiln.job.report",
}
VARIANT_BUILD_TASK_NAME = "kiln.variant.build"
REDISPATCH_TASK_NAME = "kiln.housekeeping.redispatch_waiting"


def _send_on_commit(name: str, *args) -> None:
    # A signature resolves the task lazily, so eager mode (unit tests) runs it in-process.
    transaction.on_commit(lambda: app.signature(name, args=list(args)).delay())


def enqueue_stage(*, job_id: int, stage: str, resend: bool = False) -> None:
    """Send a job's stage to the workers once the current transaction commits, under a work lease.

    `resend` (the reaper's) keeps counting the attempts of the stage sent before.
    """
    lease_offer(STAGE, job_id, resend=resend, stage_task=stage)
    _send_on_commit(STAGE_TASK_NAMES[stage], job_id)


def enqueue_variant_build(*, variant_id: int, resend: bool = False) -> None:
    lease_offer(BUILD, variant_id, resend=resend)
    _send_on_commit(VARIANT_BUILD_TASK_NAME, variant_id)


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
