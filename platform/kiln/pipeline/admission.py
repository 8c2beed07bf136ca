"""A Celery task of a limited class starts only in a slot (kiln.pipeline.capacity); refused, it goes back on its queue.

The refusal is Celery's own retry: the message is published again after KILN_ADMISSION_RETRY_SECONDS, with the
same priority, and the worker takes other work meanwhile. The job says why it waits (kiln.pipeline.waiting).
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from django.conf import settings

from kiln.registry.models import ModelVersion

from . import waiting
from .capacity import Refused, slot_acquire, slot_kept
from .models import DeploymentJob, Variant

logger = logging.getLogger(__name__)


def _retry(task, refused: Refused, what: str):
    logger.info("%s waits: %s", what, refused.message)
    return task.retry(countdown=settings.ADMISSION_RETRY_SECONDS, max_retries=None)


def run_in_slot(task, *, organization_id: int | None, work_class: str, holder: str, run: Callable[[], object],
                job_id: int | None = None) -> None:
    """Run `run` holding a slot of `work_class` for the organization; when a limit refuses, note it on the job and
    put the task back on its queue (raises Celery's Retry)."""
    if organization_id is None:
        run()  # the row is gone: the work itself finds nothing to do
        return
    slot = slot_acquire(organization_id=organization_id, work_class=work_class, holder=holder, job_id=job_id)
    if isinstance(slot, Refused):
        if job_id is not None:
            waiting.job_wait_note(job_id=job_id, cause=waiting.ORGANIZATION_LIMIT, message=slot.message)
        raise _retry(task, slot, holder)
    with slot_kept(slot):
        if job_id is not None:
            waiting.job_wait_clear(job_id=job_id, cause=waiting.ORGANIZATION_LIMIT)
        run()


def job_organization(job_id: int) -> int | None:
    return DeploymentJob.objects.filter(pk=job_id).values_list("organization_id", flat=True).first()


def variant_owner(variant_id: int) -> tuple[int | None, int | None]:
    """(organization id, job id) of a variant, or (None, None) when it is gone."""
    owner = Variant.objects.filter(pk=variant_id).values_list("organization_id", "job_id").first()
    return owner if owner else (None, None)


def version_organization(version_id: int) -> int | None:
    return ModelVersion.objects.filter(pk=version_id).values_list("model__organization_id", flat=True).first()
