"""Celery tasks: each takes ids, calls one pipeline service, and can run twice safely."""
from __future__ import annotations

from django.db import InterfaceError, OperationalError

from .celery import app

TRANSIENT = (OperationalError, InterfaceError, ConnectionError)
COMMON = {
    "acks_late": True,
    "autoretry_for": TRANSIENT,
    "retry_backoff": True,
    "retry_backoff_max": 60,
    "max_retries": 5,
}


@app.task(name="kiln.job.validate", soft_time_limit=600, time_limit=660, **COMMON)
def job_validate(job_id: int) -> None:
    from kiln.pipeline.stages import job_validate as service

    service(job_id=job_id)


@app.task(name="kiln.job.convert", soft_time_limit=1800, time_limit=1900, **COMMON)
def job_convert(job_id: int) -> None:
    from kiln.pipeline.stages import job_convert as service

    service(job_id=job_id)


@app.task(name="kiln.job.reference", soft_time_limit=1800, time_limit=1900, **COMMON)
def job_reference(job_id: int) -> None:
    from kiln.pipeline.stages import job_reference as service

    service(job_id=job_id)


@app.task(name="kiln.job.quantize", soft_time_limit=300, time_limit=360, **COMMON)
def job_quantize(job_id: int) -> None:
    from kiln.pipeline.stages import job_quantize as service

    service(job_id=job_id)


@app.task(name="kiln.variant.build", soft_time_limit=3600, time_limit=3700, **COMMON)
def variant_build(variant_id: int) -> None:
    from kiln.pipeline.stages import variant_build as service

    service(variant_id=variant_id)


@app.task(name="kiln.job.dispatch", soft_time_limit=120, time_limit=180, **COMMON)
def job_dispatch(job_id: int) -> None:
    from kiln.pipeline.stages import job_dispatch as service

    service(job_id=job_id)


@app.task(name="kiln.job.collect", soft_time_limit=600, time_limit=660, **COMMON)
def job_collect(job_id: int) -> None:
    from kiln.pipeline.stages import job_collect as service

    service(job_id=job_id)


@app.task(name="kiln.job.report", soft_time_limit=300, time_limit=360, **COMMON)
def job_report(job_id: int) -> None:
    from kiln.pipeline.stages import job_report as service

    service(job_id=job_id)


STAGE_TASKS = {
    "validate": job_validate,
    "convert": job_convert,
    "reference": job_reference,
    "quantize": job_quantize,
    "dispatch": job_dispatch,
    "collect": job_collect,
    "report": job_report,
}
