"""How a host-side stage runs: load the job if the stage may run now, do the work, record the outcome."""
from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from celery.exceptions import SoftTimeLimitExceeded

from devices.quiet import wait_while_timing
from kiln.registry.models import SourceFormat
from kiln.registry.selectors import blob_file, model_version_onnx_path
from workers.routing import CONTROL, work_class_of

from .models import STAGES, DeploymentJob
from .queue import STAGE_TASK_NAMES
from .services import job_event_add, job_fail, job_stage_finish, job_stage_start

logger = logging.getLogger(__name__)


class StageFailed(Exception):
    """A stage cannot go on for a reason the user should read."""


def _stage_index(stage: str) -> int:
    return STAGES.index(stage) if stage in STAGES else len(STAGES)


def load_active_job(job_id: int, stage: str) -> DeploymentJob | None:
    """The job, if this stage may run now: it is the job's stage, or the one the job just finished.

    Anything else is a redelivered or stray message (a later stage already runs, or the message
    belongs to an earlier life of the broker) and is dropped.
    """
    job = DeploymentJob.objects.select_related("model_version__blob", "model_version__model", "organization").filter(pk=job_id).first()
    if job is None or job.is_terminal:
        return None
    index = _stage_index(stage)
    if _stage_index(job.stage) not in (index, index - 1):
        logger.warning("dropping %s for job %s, which is at %s", stage, job_id, job.stage, extra={"job_id": job_id})
        return None
    return job


@contextmanager
def scratch_dir() -> Iterator[Path]:
    """A private temporary folder for a stage's work files, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="kiln-stage-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_stage(job_id: int, stage: str, body: Callable[[DeploymentJob], str | None]) -> bool:
    """Run one stage's body with bookkeeping; returns True when the next stage may start.

    Host work does not start while an agent of this host times a measurement (devices/quiet.py); builds in
    child processes are paused mid-way instead (workers.quantize.isolated).
    """
    job = load_active_job(job_id, stage)
    if job is None:
        return False
    if work_class_of(STAGE_TASK_NAMES.get(stage, "")) != CONTROL:
        # Model work in this process (not a paused child) waits out a device's timing window; control steps never do.
        wait_while_timing()
    job_stage_start(job=job, stage=stage)
    try:
        message = body(job) or ""
    except StageFailed as exc:
        job_fail(job=job, stage=stage, message=str(exc))
        return False
    except SoftTimeLimitExceeded:
        job_fail(job=job, stage=stage, message="The stage ran past its time limit.")
        return False
    except Exception as exc:
        logger.exception("stage %s of job %s crashed", stage, job_id, extra={"job_id": job_id})
        job_fail(job=job, stage=stage, message=f"Unexpected error: {type(exc).__name__}: {exc}")
        return False
    job.refresh_from_db()
    if job.is_terminal:
        return False
    job_stage_finish(job=job, stage=stage, message=message)
    return True


def run_stage_open(job_id: int, stage: str, body: Callable[[DeploymentJob], str]) -> bool:
    """Like run_stage, but the stage stays running: fan-out tasks finish it."""
    job = load_active_job(job_id, stage)
    if job is None:
        return False
    job_stage_start(job=job, stage=stage)
    try:
        job_event_add(job=job, stage=stage, message=body(job))
    except StageFailed as exc:
        job_fail(job=job, stage=stage, message=str(exc))
        return False
    except Exception as exc:
        logger.exception("stage %s of job %s crashed", stage, job_id, extra={"job_id": job_id})
        job_fail(job=job, stage=stage, message=f"{type(exc).__name__}: {exc}")
        return False
    return True


def source_model_path(job: DeploymentJob) -> Path:
    return model_version_onnx_path(job.model_version)


def working_model_path(job: DeploymentJob) -> Path:
    """The converted model when conversion produced one, else the upload itself."""
    if job.converted_blob_id:
        return blob_file(job.converted_blob)
    return source_model_path(job)


def model_folder(job: DeploymentJob, *, source: bool = False) -> Path | None:
    """The folder of the job's model (the source one, else the working one) when it has its own: an extracted zip
    with its external data, which a sandbox must see whole; None when the model is one file."""
    if (source or not job.converted_blob_id) and job.model_version.source_format == SourceFormat.ONNX_ZIP:
        return source_model_path(job).parent
    return None
