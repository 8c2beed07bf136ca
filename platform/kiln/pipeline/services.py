"""Writes for deployment jobs: create, cancel, and the bookkeeping of stages and events."""
from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from kiln.core.errors import KilnError
from kiln.fleet.models import Agent
from kiln.registry.services import blob_create, storage_quota_check
from kiln_contract.contract import LABEL_DECLARATIONS
from kiln_contract.feeds import plan_problems

from . import specs
from .models import STAGES, Artifact, DeploymentJob, DeviceTask, DeviceTaskStatus, JobEvent, JobStatus
from .queue import enqueue_stage, wake_agents

logger = logging.getLogger(__name__)

LABEL_TOLERANCES = ("accuracy", "mean_iou", "sequence_accuracy", "cer")
STAGE_PROGRESS = {"validate": 0.0, "convert": 0.05, "support": 0.1, "reference": 0.15, "quantize": 0.25, "dispatch": 0.55, "devices": 0.6, "report": 0.95}


def _initial_stages() -> list[dict]:
    return [{"name": name, "status": "pending", "started_at": None, "finished_at": None, "message": ""} for name in STAGES]


def _check_dataset(dataset, *, organization, signature, role: str, state: dict, initial_state: dict) -> dict | None:
    """The dataset's feed plan (kiln_contract/feeds.py) for this model, or a 400 saying every way it does not fit."""
    if dataset is None:
        return None
    if dataset.organization_id != organization.id:
        raise KilnError("Not found.", code="not_found", status_code=404)
    if dataset.kind != role:
        raise KilnError(
            f"Dataset {dataset.name!r} was uploaded as a {dataset.kind} set; the {role}_dataset must be a {role} set.",
            code="dataset_kind",
        )
    info = {"samples": dataset.samples, "arrays": dataset.arrays, "has_labels": dataset.has_labels, "format": dataset.format}
    plan, problems = plan_problems(info, signature, state=state, initial_state=initial_state)
    if problems:
        raise KilnError(
            f"The {role} dataset {dataset.name!r} does not match the model's inputs: {'; '.join(problems)}",
            code="dataset_mismatch",
            details={"problems": problems},
        )
    return plan


def _job_feeds(*, signature, calibration_dataset, validation_dataset, organization, state, initial_state, calibration_subset) -> dict:
    """How each dataset is fed, checked against the model; a state mapping needs a dataset to carry it through."""
    state, initial_state = specs.parse_state(state, initial_state)
    if (state or initial_state) and calibration_dataset is None and validation_dataset is None:
        problems = plan_problems({"arrays": {}}, signature, state=state, initial_state=initial_state)[1]
        raise KilnError(f"A state mapping needs a dataset of sequences. {'; '.join(problems)}".strip(), code="dataset_required")
    plans = {role: _check_dataset(dataset, organization=organization, signature=signature, role=role, state=state, initial_state=initial_state)
             for role, dataset in (("calibration", calibration_dataset), ("validation", validation_dataset))}
    subset = specs.parse_calibration_subset(calibration_subset, available=calibration_dataset.samples if calibration_dataset else None)
    return {"state": state, "initial_state": initial_state, **plans, "calibration_subset": subset}


def _check_targets(targets: list, *, organization) -> None:
    agent_ids = [t for t in targets if isinstance(t, int)]
    if agent_ids:
        found = set(Agent.objects.filter(organization=organization, pk__in=agent_ids, revoked_at__isnull=True).values_list("pk", flat=True))
        missing = sorted(set(agent_ids) - found)
        if missing:
            raise KilnError(f"Unknown agent id(s): {', '.join(map(str, missing))}.", code="invalid_targets")


def _check_label_metrics(declared: list[dict], tolerance: dict, validation_dataset) -> None:
    """Label metrics need labels, and labels of a shape some metric can read."""
    wanted = [entry["kind"] for entry in declared if entry["kind"] in LABEL_DECLARATIONS]
    if tolerance["metric"] in LABEL_TOLERANCES:
        wanted.append(tolerance["metric"])
    if not wanted:
        return
    if not (validation_dataset and validation_dataset.has_labels):
        raise KilnError(f"{wanted[0]} needs a validation dataset with labels.", code="labels_required")
    labels = (validation_dataset.arrays or {}).get("labels") or {}
    dtype, shape = str(labels.get("dtype", "")), list(labels.get("shape") or [])
    for kind in wanted:
        problem = None
        if not dtype.startswith(("int", "uint")):
            problem = f"labels are {dtype}; {kind} needs integer labels"
        elif kind in ("ctc", "sequence_accuracy", "cer") and len(shape) != 2:
            problem = f"labels of shape {shape} fit no CTC metric: write one padded row of character ids per sample, [samples, max_length]"
        elif kind == "mean_iou" and len(shape) < 3:
            problem = f"labels of shape {shape} fit no mask metric: write one [height, width] mask per sample"
        if problem:
            raise KilnError(f"The validation labels do not fit {kind}: {problem}.", code="labels_mismatch")


def job_create(*, organization, user, model_version, precisions, calibration_dataset=None, validation_dataset=None, targets=None, tolerance=None,
               metrics=None, package=None, rerun_of: DeploymentJob | None = None, state=None, initial_state=None,
               calibration_subset=None, budget_minutes=None) -> DeploymentJob:
    """Check a deployment request, store it as a job and start its pipeline."""
    requested = specs.parse_precisions(precisions)
    parsed_package = specs.parse_package(package)
    parsed_tolerance = specs.parse_tolerance(tolerance)
    parsed_targets = specs.parse_targets(targets)
    parsed_budget = specs.parse_budget_minutes(budget_minutes)
    signature = model_version.signature
    declared = specs.parse_metrics(metrics, outputs=[output["name"] for output in (signature or {}).get("outputs", [])])
    feeds = _job_feeds(signature=signature, calibration_dataset=calibration_dataset, validation_dataset=validation_dataset,
                       organization=organization, state=state, initial_state=initial_state, calibration_subset=calibration_subset)
    if "int8" in requested and calibration_dataset is None:
        raise KilnError("int8 (static) needs a calibration dataset; add one or use int8-dynamic.", code="calibration_required")
    _check_label_metrics(declared, parsed_tolerance, validation_dataset)
    _check_targets(parsed_targets, organization=organization)
    # A job stores variants, engines and packages: none is started once the organization is at its quota.
    storage_quota_check(organization=organization, adding_bytes=0, what="A deployment job")
    with transaction.atomic():
        job = DeploymentJob.objects.create(
            organization=organization,
            created_by=user,
            model_version=model_version,
            precisions=requested,
            calibration_dataset=calibration_dataset,
            validation_dataset=validation_dataset,
            targets=parsed_targets,
            tolerance=parsed_tolerance,
            metrics=declared,
            feeds=feeds,
            stages=_initial_stages(),
            package=parsed_package,
            toolchain={"host": specs.host_toolchain()},
            rerun_of=rerun_of,
            search={"budget_minutes": parsed_budget},
        )
        again = f" Re-run of job {rerun_of.id}." if rerun_of else ""
        job_event_add(job=job, stage="validate", message=f"Job created for {model_version.model.name} v{model_version.number}: precisions {', '.join(requested)}.{again}")
        enqueue_stage(job_id=job.id, stage="validate")
    return job


def job_rerun(*, job: DeploymentJob, user) -> DeploymentJob:
    """The same inputs again (model version, datasets, precisions, targets, tolerance, metrics, package)."""
    return job_create(
        organization=job.organization, user=user, model_version=job.model_version, precisions=job.precisions,
        calibration_dataset=job.calibration_dataset, validation_dataset=job.validation_dataset, targets=job.targets,
        tolerance=job.tolerance, metrics=job.metrics, package=job.package, rerun_of=job,
        state=(job.feeds or {}).get("state"), initial_state=(job.feeds or {}).get("initial_state"),
        calibration_subset=(job.feeds or {}).get("calibration_subset"),
        budget_minutes=job.search.get("budget_minutes"),
    )


def artifact_store(*, job: DeploymentJob, kind: str, name: str, path=None, blob=None, precision: str = "", backend: str = "") -> Artifact:
    """Keep a file (or a blob already stored) as one of the job's artifacts (idempotent by job, kind and name)."""
    blob = blob or blob_create(organization=job.organization, path=path)
    artifact, _ = Artifact.objects.update_or_create(
        job=job, kind=kind, name=name,
        defaults={"organization": job.organization, "blob": blob, "precision": precision, "backend": backend},
    )
    return artifact


def job_work_add(*, job_id: int, seconds: float) -> None:
    """Count seconds of the job's own work (a build, a planning step, a device task), never time spent waiting: what
    the search's budget is measured in."""
    if seconds > 0:
        DeploymentJob.objects.filter(pk=job_id).update(work_seconds=F("work_seconds") + float(seconds))


def job_event_add(*, job: DeploymentJob, stage: str, message: str, level: str = "info", task_id: int | None = None) -> JobEvent:
    log = logger.warning if level == "warning" else logger.error if level == "error" else logger.info
    log("job %s [%s] %s", job.id, stage, message, extra={"job_id": job.id, "stage": stage, "task_id": task_id})
    return JobEvent.objects.create(job=job, stage=stage, level=level, message=message[:10000])


def _set_stage(job: DeploymentJob, stage: str, **changes) -> None:
    for entry in job.stages:
        if entry["name"] == stage:
            entry.update(changes)


def _add_stage_time(job: DeploymentJob, stage: str, finished_at) -> None:
    """A stage that runs once per search round keeps the time of every run (`seconds`, `runs`), not only the last;
    started_at/finished_at stay the last run's."""
    for entry in job.stages:
        if entry["name"] == stage and entry.get("started_at") and entry.get("status") == "running":
            elapsed = (finished_at - datetime.fromisoformat(entry["started_at"])).total_seconds()
            entry["seconds"] = round(entry.get("seconds", 0.0) + max(elapsed, 0.0), 3)
            entry["runs"] = entry.get("runs", 0) + 1


def job_stage_start(*, job: DeploymentJob, stage: str) -> None:
    now = timezone.now().isoformat()
    _set_stage(job, stage, status="running", started_at=now)
    job.stage = stage
    if job.status in (JobStatus.QUEUED, JobStatus.WAITING_FOR_DEVICES) or job.status == JobStatus.RUNNING:
        job.status = JobStatus.RUNNING
    job.progress = max(job.progress, STAGE_PROGRESS.get(stage, job.progress))
    job.save(update_fields=["stages", "stage", "status", "progress", "updated_at"])


def job_stage_finish(*, job: DeploymentJob, stage: str, message: str = "", status: str = "done") -> None:
    now = timezone.now()
    _add_stage_time(job, stage, now)
    _set_stage(job, stage, status=status, finished_at=now.isoformat(), message=message)
    job.save(update_fields=["stages", "updated_at"])


def job_progress(*, job: DeploymentJob, progress: float) -> None:
    DeploymentJob.objects.filter(pk=job.pk, progress__lt=progress).update(progress=progress, updated_at=timezone.now())


def job_fail(*, job: DeploymentJob, stage: str, message: str) -> None:
    job.refresh_from_db()
    if job.is_terminal:
        return
    now = timezone.now()
    _add_stage_time(job, stage, now)
    _set_stage(job, stage, status="failed", finished_at=now.isoformat(), message=message)
    job.status = JobStatus.FAILED
    job.error = f"{stage}: {message}"
    job.finished_at = timezone.now()
    job.save(update_fields=["stages", "status", "error", "finished_at", "updated_at"])
    job_event_add(job=job, stage=stage, message=message, level="error")
    DeviceTask.objects.filter(job=job, status=DeviceTaskStatus.QUEUED).update(status=DeviceTaskStatus.CANCELED, finished_at=timezone.now())


def job_succeed(*, job: DeploymentJob, message: str) -> None:
    job.status = JobStatus.SUCCEEDED
    job.stage = "done"
    job.progress = 1.0
    job.finished_at = timezone.now()
    job.save(update_fields=["status", "stage", "progress", "finished_at", "updated_at"])
    job_event_add(job=job, stage="report", message=message)


@transaction.atomic
def job_cancel(*, job: DeploymentJob) -> DeploymentJob:
    """Cancel a job: queued work stops now, running device tasks at their next heartbeat."""
    job = DeploymentJob.objects.select_for_update().get(pk=job.pk)
    if job.is_terminal:
        raise KilnError(f"The job has already {job.status}.", code="job_finished", status_code=409)
    now = timezone.now()
    job.status = JobStatus.CANCELED
    job.finished_at = now
    for entry in job.stages:
        if entry["status"] in ("pending", "running"):
            entry["status"] = "canceled"
    job.save(update_fields=["status", "finished_at", "stages", "updated_at"])
    # Leased tasks are marked too; their agents learn it from the heartbeat or progress answer.
    DeviceTask.objects.filter(job=job, status__in=[DeviceTaskStatus.QUEUED, DeviceTaskStatus.LEASED]).update(
        status=DeviceTaskStatus.CANCELED, finished_at=now
    )
    job_event_add(job=job, stage=job.stage, message="Canceled by the user.", level="warning")
    # Waiting agents re-check at once: the job's queued tasks are gone and none may still be leased.
    wake_agents(organization_id=job.organization_id)
    return job
