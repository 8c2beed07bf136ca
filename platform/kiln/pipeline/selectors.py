"""Reads for jobs, variants, device tasks and artifacts, scoped to one organization."""
from __future__ import annotations

from datetime import timedelta

from django.db.models import Count, DurationField, ExpressionWrapper, F, Max, Q, Sum
from django.shortcuts import get_object_or_404

from kiln.core.errors import KilnError
from kiln.reports.outcome import job_outcome_reports
from kiln_contract.labels import effective_precision

from . import specs
from .models import Artifact, DeploymentJob, DeviceTask, JobEvent

# What a job list shows (JobListSerializer): a model version's signature, op histogram and checks,
# and a job's evaluation plan, stage records and leases stay in the database.
JOB_LIST_FIELDS = (
    "status", "stage", "progress", "error", "precisions", "targets", "tolerance", "metrics", "calibration_dataset",
    "validation_dataset", "created_at", "finished_at", "rerun_of", "package", "toolchain", "feeds", "search", "work_seconds", "waiting",
    "stage_task", "stage_lease_owner", "stage_lease_expires_at", "stage_offered_at", "organization_id",
    "model_version__number", "model_version__model__name", "model_version__blob__sha256",
)


def job_list(*, organization, model_id: str | None = None):
    """The organization's deployments, newest first; with `model_id`, only that model's. A page is
    three queries: the count, the jobs with their model names, and their reports' outcomes."""
    jobs = (DeploymentJob.objects.filter(organization=organization).select_related("model_version__model", "model_version__blob")
            .only(*JOB_LIST_FIELDS)
            .prefetch_related(job_outcome_reports()))
    if model_id not in (None, ""):
        if not str(model_id).isdigit():
            raise KilnError("model must be an id.", code="invalid_filter")
        jobs = jobs.filter(model_version__model_id=int(model_id))
    return jobs


def search_work_seconds(job: DeploymentJob) -> float:
    """Seconds of work the job has had so far (its builds, planning and device time; never waiting), read fresh: workers
    add to it as they finish (kiln.pipeline.services.job_work_add)."""
    fresh = DeploymentJob.objects.filter(pk=job.pk).values_list("work_seconds", flat=True).first()
    return float(fresh if fresh is not None else job.work_seconds)


def variant_effective_precision(variant) -> str:
    """What a variant computes in (kiln_contract.labels): an FP32 build under OpenVINO's bf16 hint is bf16. The compile options
    count on the variant's one runtime when it has one (ONNX Runtime ignores the hint); on several, as planned."""
    backends = variant.backends or []
    return effective_precision(variant.precision, variant.options.get("compile") or {}, backends[0] if len(backends) == 1 else None,
                               variant.options)


def search_seconds_left(job: DeploymentJob) -> float:
    """What the `auto` search has left of its budget (`budget_minutes` of its own work, not of waiting), in seconds;
    negative once spent."""
    return job.search.get("budget_minutes", specs.DEFAULT_BUDGET_MINUTES) * 60 - search_work_seconds(job)


def search_budget(job: DeploymentJob) -> dict:
    """`{"minutes", "started_at", "work_seconds", "seconds_left", "first_answer_at", "stopped"}` of an `auto` job's
    search: the budget counts the job's own build and device time; {} for explicit precisions."""
    if job.precisions != [specs.AUTO]:
        return {}
    minutes = job.search.get("budget_minutes", specs.DEFAULT_BUDGET_MINUTES)
    started = job.search.get("started_at")
    left = None
    if started is not None and not job.is_terminal:
        left = max(0.0, minutes * 60 - job.work_seconds)
    return {"minutes": minutes, "started_at": started, "work_seconds": round(job.work_seconds, 1), "seconds_left": left,
            "first_answer_at": job.search.get("first_answer_at"), "stopped": job.search.get("stopped")}


def job_get(*, organization, job_id: int) -> DeploymentJob:
    queryset = DeploymentJob.objects.select_related("model_version__model", "model_version__blob").prefetch_related(
        "events", "variants__artifact__blob", "device_tasks__leased_by", "device_tasks__pinned_agent", "device_tasks__variant", job_outcome_reports()
    )
    return get_object_or_404(queryset, organization=organization, pk=job_id)


def job_artifacts(*, job: DeploymentJob):
    return job.artifacts.select_related("blob").order_by("id")


def artifact_get(*, organization, artifact_id: int) -> Artifact:
    return get_object_or_404(Artifact.objects.select_related("blob"), organization=organization, pk=artifact_id)


def job_change_fingerprint(*, job_id: int) -> tuple:
    """Changes whenever anything the job page shows changes: the job row, its events, its tasks' progress."""
    job = DeploymentJob.objects.filter(pk=job_id).values_list("updated_at", "status").first()
    tasks = DeviceTask.objects.filter(job_id=job_id).aggregate(count=Count("id"), progress=Sum("progress"), attempts=Sum("attempt"),
                                                                 started=Max("started_at"), finished=Max("finished_at"))
    events = JobEvent.objects.filter(job_id=job_id).count()
    stages = tuple(DeviceTask.objects.filter(job_id=job_id).values_list("stage", "status").order_by("id"))
    return job, tuple(sorted(tasks.items())), events, stages


# -- operations (every organization: for /metrics, never for a user's answer) ----------------

JOB_DURATION_BUCKETS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0)


def jobs_by_status_and_stage() -> list[tuple[str, str, int]]:
    """How many jobs sit in each (status, stage): the queue depth per stage."""
    rows = DeploymentJob.objects.values_list("status", "stage").annotate(count=Count("id")).order_by()
    return [(status, stage, count) for status, stage, count in rows]


def device_tasks_by_status() -> dict[str, int]:
    return dict(DeviceTask.objects.values_list("status").annotate(count=Count("id")).order_by())


def finished_job_durations() -> tuple[list[int], float, int]:
    """Cumulative counts per JOB_DURATION_BUCKETS (seconds from creation to the end), the sum and the count."""
    duration = ExpressionWrapper(F("finished_at") - F("created_at"), output_field=DurationField())
    finished = DeploymentJob.objects.filter(finished_at__isnull=False).annotate(duration=duration)
    aggregates = {f"le{i}": Count("id", filter=Q(duration__lte=timedelta(seconds=bound))) for i, bound in enumerate(JOB_DURATION_BUCKETS)}
    values = finished.aggregate(total=Sum("duration"), count=Count("id"), **aggregates)
    total = values["total"].total_seconds() if values["total"] else 0.0
    return [values[f"le{i}"] for i in range(len(JOB_DURATION_BUCKETS))], total, values["count"]
