"""Celery tasks: each takes ids, calls one pipeline service under its work lease, and can run twice safely."""
from __future__ import annotations

from django.db import InterfaceError, OperationalError

from kiln.fleet.services import agents_mark_offline
from kiln.pipeline import quantize, stages, support
from kiln.pipeline.admission import job_organization, run_in_slot, variant_owner, version_organization
from kiln.pipeline.capacity import slots_expire
from kiln.pipeline.device_tasks import device_tasks_requeue_expired, jobs_redispatch_waiting
from kiln.pipeline.leases import stage_run_leased, variant_build_leased
from kiln.pipeline.queue import REDISPATCH_TASK_NAME, STAGE_TASK_NAMES, VARIANT_BUILD_TASK_NAME
from kiln.pipeline.reaper import work_reap_expired
from kiln.registry.services import SUPPORT_TASK_NAME, model_version_check_support, uploads_expire

from .celery import app
from .routing import BUILD, CHECK

TRANSIENT = (OperationalError, InterfaceError, ConnectionError)
COMMON = {
    "acks_late": True,
    "autoretry_for": TRANSIENT,
    "retry_backoff": True,
    "retry_backoff_max": 60,
    "max_retries": 5,
}
# Housekeeping runs again on the next beat; a retry would only pile up behind it.
HOUSEKEEPING = {"acks_late": True, "soft_time_limit": 60, "time_limit": 90}


def _build_stage(task, job_id: int, stage: str, work) -> None:
    """A build-class stage of a job, in a build slot of its organization."""
    run_in_slot(task, organization_id=job_organization(job_id), work_class=BUILD, holder=f"job {job_id}: {stage}", job_id=job_id,
                run=lambda: stage_run_leased(job_id=job_id, stage=stage, work=work))


@app.task(name=STAGE_TASK_NAMES["validate"], bind=True, soft_time_limit=600, time_limit=660, **COMMON)
def job_validate(self, job_id: int) -> None:
    _build_stage(self, job_id, "validate", stages.job_validate)


@app.task(name=STAGE_TASK_NAMES["convert"], bind=True, soft_time_limit=1800, time_limit=1900, **COMMON)
def job_convert(self, job_id: int) -> None:
    _build_stage(self, job_id, "convert", stages.job_convert)


@app.task(name=STAGE_TASK_NAMES["support"], bind=True, soft_time_limit=660, time_limit=720, **COMMON)
def job_support(self, job_id: int) -> None:
    run_in_slot(self, organization_id=job_organization(job_id), work_class=CHECK, holder=f"job {job_id}: operator support",
                job_id=job_id, run=lambda: stage_run_leased(job_id=job_id, stage="support", work=support.job_support))


@app.task(name=SUPPORT_TASK_NAME, bind=True, soft_time_limit=660, time_limit=720, **COMMON)
def model_operator_support(self, version_id: int) -> None:
    run_in_slot(self, organization_id=version_organization(version_id), work_class=CHECK, holder=f"model version {version_id}: operator support",
                run=lambda: model_version_check_support(version_id=version_id))


@app.task(name=STAGE_TASK_NAMES["reference"], bind=True, soft_time_limit=1800, time_limit=1900, **COMMON)
def job_reference(self, job_id: int) -> None:
    _build_stage(self, job_id, "reference", stages.job_reference)


@app.task(name=STAGE_TASK_NAMES["quantize"], bind=True, soft_time_limit=300, time_limit=360, **COMMON)
def job_quantize(self, job_id: int) -> None:
    _build_stage(self, job_id, "quantize", quantize.job_quantize)


@app.task(name=STAGE_TASK_NAMES["plan"], bind=True, soft_time_limit=900, time_limit=960, **COMMON)
def job_plan(self, job_id: int) -> None:
    _build_stage(self, job_id, "plan", quantize.job_plan)


@app.task(name=VARIANT_BUILD_TASK_NAME, bind=True, soft_time_limit=3600, time_limit=3700, **COMMON)
def variant_build(self, variant_id: int) -> None:
    organization_id, job_id = variant_owner(variant_id)
    run_in_slot(self, organization_id=organization_id, work_class=BUILD, holder=f"job {job_id}: variant {variant_id}", job_id=job_id,
                run=lambda: variant_build_leased(variant_id=variant_id, work=quantize.variant_build))


@app.task(name=STAGE_TASK_NAMES["dispatch"], soft_time_limit=120, time_limit=180, **COMMON)
def job_dispatch(job_id: int) -> None:
    stage_run_leased(job_id=job_id, stage="dispatch", work=stages.job_dispatch)


@app.task(name=STAGE_TASK_NAMES["collect"], soft_time_limit=120, time_limit=180, **COMMON)
def job_collect(job_id: int) -> None:
    stage_run_leased(job_id=job_id, stage="collect", work=quantize.job_collect)


@app.task(name=STAGE_TASK_NAMES["report"], soft_time_limit=300, time_limit=360, **COMMON)
def job_report(job_id: int) -> None:
    stage_run_leased(job_id=job_id, stage="report", work=stages.job_report)


# -- housekeeping (Celery beat; idempotent, safe when several hosts run it at once) -----------

@app.task(name="kiln.housekeeping.requeue_expired_leases", **HOUSEKEEPING)
def requeue_expired_leases() -> int:
    return device_tasks_requeue_expired()


@app.task(name=REDISPATCH_TASK_NAME, **HOUSEKEEPING)
def redispatch_waiting(organization_id: int | None = None) -> int:
    return jobs_redispatch_waiting(organization_id=organization_id)


@app.task(name="kiln.housekeeping.mark_agents_offline", **HOUSEKEEPING)
def mark_agents_offline() -> int:
    return agents_mark_offline()


@app.task(name="kiln.housekeeping.reap_stuck_work", **HOUSEKEEPING)
def reap_stuck_work() -> int:
    return work_reap_expired()


@app.task(name="kiln.housekeeping.expire_uploads", **HOUSEKEEPING)
def expire_uploads() -> int:
    return uploads_expire()


@app.task(name="kiln.housekeeping.expire_work_slots", **HOUSEKEEPING)
def expire_work_slots() -> int:
    return slots_expire()
