"""Device-task transitions: dispatch, start under a lease, finish, requeue, and what a job does next.

Every change of a device task's status happens here. `fleet` decides which agent gets which task
and checks who may report what, then calls these functions; it never sets a status itself.
"""
from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from kiln.fleet.selectors import targets_resolve
from kiln.registry.services import model_version_support_record
from kiln_contract.labels import ignored_options

from .models import TERMINAL_TASK_STATUSES, DeploymentJob, DeviceTask, DeviceTaskPurpose, DeviceTaskStatus, JobStatus, VariantStatus
from .queue import enqueue_stage, wake_agents
from .retime import retime_results_store, retime_when_quiet
from .services import job_event_add, job_fail, job_progress, job_stage_finish, job_stage_start, job_work_add
from .support import runnable_backends, skipped_backends

logger = logging.getLogger(__name__)

HANDED_BACK = "handed_back"


# -- dispatch -------------------------------------------------------------------------------

def job_dispatch_device_tasks(*, job: DeploymentJob) -> None:
    """Create one device task per (variant x target x backend both support)."""
    targets, missing = targets_resolve(job=job)
    if not targets:
        what = ", ".join(missing) if missing else "no agent is online"
        if job.status != JobStatus.WAITING_FOR_DEVICES:
            job.status = JobStatus.WAITING_FOR_DEVICES
            job.save(update_fields=["status", "updated_at"])
            job_event_add(job=job, stage="dispatch", level="warning", message=f"Waiting for devices ({what}). Start one with `kiln-agent run`; the job continues when it connects.")
        return
    for name in missing:
        job_event_add(job=job, stage="dispatch", level="warning", message=f"Target {name} matches no agent; skipped.")
    variants = list(job.variants.filter(status=VariantStatus.READY))
    created, new_tasks = 0, []
    with transaction.atomic():
        for target in targets:
            for variant in variants:
                for backend in sorted(runnable_backends(job, set(variant.backends) & target.backends)):
                    if ignored_options(backend, variant.options.get("compile")):
                        # The backend would not act on the variant's options: its timing would be another variant's under this name.
                        continue
                    task, was_created = DeviceTask.objects.get_or_create(
                        job=job, variant=variant, backend=backend, target=target.key, purpose=DeviceTaskPurpose.MEASURE,
                        defaults={"organization": job.organization, "pinned_agent": target.pinned_agent, "required_labels": target.labels},
                    )
                    if was_created:
                        new_tasks.append(task)
                    created += was_created
        if not job.device_tasks.exists():
            offered = sorted(set().union(*(t.backends for t in targets)))
            needed = sorted(set().union(*(set(v.backends) for v in variants)))
            skipped = "".join(f" {backend} skipped: {reason}" for backend, reason in skipped_backends(job).items())
            job_fail(job=job, stage="dispatch", message=f"No target device can run any variant: devices offer {offered or 'no runtime'}, variants need {needed}.{skipped}")
            return
        job.status = JobStatus.RUNNING
        job.save(update_fields=["status", "updated_at"])
        job_stage_finish(job=job, stage="dispatch", message=f"{created} device task(s) for {len(targets)} target(s)")
        job_stage_start(job=job, stage="devices")
        job_event_add(job=job, stage="dispatch", message=f"Dispatched {created} device task(s) to {', '.join(t.name for t in targets)}.")
        wake_agents(organization_id=job.organization_id, tasks=new_tasks)
    device_task_after_terminal(job_id=job.id)


def jobs_redispatch_waiting(*, organization_id: int | None = None) -> int:
    """Dispatch jobs that wait for devices (of one organization, or all); returns how many now run."""
    waiting = DeploymentJob.objects.filter(status=JobStatus.WAITING_FOR_DEVICES, stage="dispatch")
    if organization_id is not None:
        waiting = waiting.filter(organization_id=organization_id)
    started = 0
    for job in waiting.select_related("organization"):
        with transaction.atomic():
            # Another host may dispatch the same job at the same moment: the row lock orders them.
            locked = DeploymentJob.objects.select_for_update().filter(pk=job.pk, status=JobStatus.WAITING_FOR_DEVICES, stage="dispatch").first()
            if locked is None:
                continue
            job_dispatch_device_tasks(job=locked)
            started += locked.status == JobStatus.RUNNING
    return started


# -- one task's life ------------------------------------------------------------------------

def device_task_start(*, task: DeviceTask, agent, now=None) -> bool:
    """Queued -> leased by `agent` for one lease period (compare-and-set: only one agent wins)."""
    now = now or timezone.now()
    return bool(DeviceTask.objects.filter(pk=task.pk, status=DeviceTaskStatus.QUEUED).update(
        status=DeviceTaskStatus.LEASED,
        leased_by=agent,
        attempt=F("attempt") + 1,
        lease_expires_at=now + timedelta(seconds=settings.AGENT_LEASE_SECONDS),
        started_at=now,
        reported_at=now,
        stage="leased",
        message=f"leased by {agent.name}",
        error="",
    ))


def device_work_seconds(*, task: DeviceTask, metrics: dict) -> float:
    """A device task's own time on its device: from its lease to its result, less what it waited for quiet windows
    (builds' turns, other agents' windows) as its windows report."""
    if task.started_at is None:
        return 0.0
    waited = sum(float(window.get("waited_s") or 0.0) for window in (metrics or {}).get("windows") or [] if isinstance(window, dict))
    return max(0.0, (timezone.now() - task.started_at).total_seconds() - waited)


def device_task_finish(*, task: DeviceTask, agent, status: str, error: str, metrics: dict, accuracy: dict, profile: dict, log: str, summary: str,
                       support: dict | None = None) -> bool:
    """Leased -> succeeded or failed, for the attempt the agent holds; False when it no longer holds it."""
    with transaction.atomic():
        changed = DeviceTask.objects.filter(pk=task.pk, status=DeviceTaskStatus.LEASED, attempt=task.attempt, leased_by=agent).update(
            status=status, error=error, metrics=metrics, accuracy=accuracy, profile=profile, log=log,
            stage="done", message=summary, progress=1.0, finished_at=timezone.now(), support=support or {},
        )
        if not changed:
            return False
        if task.purpose == DeviceTaskPurpose.MEASURE:
            # The search's device time; re-timing the finalists is the decision's (bounded by its own rounds and quiet waits).
            job_work_add(job_id=task.job_id, seconds=device_work_seconds(task=task, metrics=metrics))
        if support and task.variant.precision == "fp32":
            # The FP32 variant is the model as uploaded (converted): the device's answer is the model's, for its page.
            model_version_support_record(version=task.job.model_version, answers=[support], where=agent.name, sha256=task.variant.artifact.blob.sha256
                                         if task.variant.artifact_id else "")
        if task.purpose == DeviceTaskPurpose.RETIME and status == DeviceTaskStatus.SUCCEEDED:
            stored = retime_results_store(task=task, metrics=metrics)
            retaken = sum(int(window.get("retaken") or 0) for window in metrics.get("windows") or [])
            rounds = len((metrics.get("retime") or [{}])[0].get("interleaved_medians_ms") or [])
            again = f"; {retaken} busy round(s) re-taken" if retaken else ""
            waited = metrics.get("quiet_wait")
            waited = (f"; after waiting {waited['waited_s']:.0f} s for a quiet device ({'it was' if waited['quiet'] else 'it stayed busy'})"
                      if waited else "")
            job_event_add(job=task.job, stage="devices", message=f"{agent.name}: {stored} finalist(s) re-timed side by side in {rounds} "
                          f"interleaved rounds ({metrics.get('stopped') or 'done'}){again}{waited}", task_id=task.id)
            if not retime_when_quiet(task=task, metrics=metrics, agent_name=agent.name):
                device_task_after_terminal(job_id=task.job_id)
            return True
        level = "info" if status == DeviceTaskStatus.SUCCEEDED else "error"
        detail = "" if status == DeviceTaskStatus.SUCCEEDED else f": {error}"
        job_event_add(job=task.job, stage="devices", level=level, message=f"{agent.name}: {task.variant.key} on {task.backend} {status}{detail}", task_id=task.id)
        device_task_after_terminal(job_id=task.job_id)
    return True


def device_task_requeue(*, task: DeviceTask, reason: str, event: str = "") -> bool:
    """Leased -> queued again at once (handed back, agent revoked or restarted); False if it was not leased."""
    with transaction.atomic():
        changed = DeviceTask.objects.filter(pk=task.pk, status=DeviceTaskStatus.LEASED, attempt=task.attempt, leased_by_id=task.leased_by_id).update(
            status=DeviceTaskStatus.QUEUED, leased_by=None, lease_expires_at=None, stage="requeued", message=reason
        )
        if changed:
            if event:
                job_event_add(job=task.job, stage="devices", level="warning", message=event, task_id=task.id)
            wake_agents(organization_id=task.organization_id, tasks=[task])
    return bool(changed)


def device_tasks_requeue_held_by(*, agent, reason: str) -> int:
    """Requeue every task an agent holds (it was revoked, or it asks for work and so holds nothing)."""
    count = 0
    for task in DeviceTask.objects.filter(leased_by=agent, status=DeviceTaskStatus.LEASED).select_related("job"):
        count += device_task_requeue(task=task, reason=reason)
    return count


def device_tasks_requeue_expired() -> int:
    """Return tasks whose lease ran out to the queue; give up after the last attempt.

    Compare-and-set on (status, attempt): safe when several hosts run it at the same moment.
    """
    now = timezone.now()
    count = 0
    for task in DeviceTask.objects.filter(status=DeviceTaskStatus.LEASED, lease_expires_at__lt=now).select_related("job"):
        still = DeviceTask.objects.filter(pk=task.pk, status=DeviceTaskStatus.LEASED, attempt=task.attempt, lease_expires_at__lt=now)
        with transaction.atomic():
            if task.attempt >= settings.DEVICE_TASK_MAX_ATTEMPTS:
                changed = still.update(
                    status=DeviceTaskStatus.FAILED, error=f"The lease expired {task.attempt} times; the device stopped answering.", finished_at=now
                )
                if changed:
                    device_task_after_terminal(job_id=task.job_id)
            else:
                changed = still.update(
                    status=DeviceTaskStatus.QUEUED, leased_by=None, lease_expires_at=None, stage="requeued",
                    message=f"lease of attempt {task.attempt} expired",
                )
                if changed:
                    job_event_add(job=task.job, stage="devices", level="warning", message=f"Device task {task.id} ({task.backend}) lost its agent; requeued.", task_id=task.id)
                    wake_agents(organization_id=task.organization_id, tasks=[task])
        count += changed
    return count


def device_tasks_release_retimes(*, agent_ids: list[int], reason: str) -> int:
    """Queued re-timing tasks pinned to agents that went away (offline, revoked) are canceled, so their jobs report
    with the first pass instead of waiting for a device that may never come back; returns how many."""
    count = 0
    for task in DeviceTask.objects.filter(purpose=DeviceTaskPurpose.RETIME, status=DeviceTaskStatus.QUEUED, pinned_agent_id__in=agent_ids):
        with transaction.atomic():
            if not DeviceTask.objects.filter(pk=task.pk, status=DeviceTaskStatus.QUEUED).update(
                    status=DeviceTaskStatus.CANCELED, error=reason, finished_at=timezone.now()):
                continue
            # A task queued again for a quiet re-timing already holds busy rounds: the decision rests on those, provisional.
            fallback = ("the decision rests on the busy rounds already timed and stays provisional" if (task.metrics or {}).get("retime")
                        else "the decision rests on the first pass")
            job_event_add(job=task.job, stage="devices", level="warning", task_id=task.id,
                          message=f"The finalists were not re-timed side by side: {reason}; {fallback}.")
            device_task_after_terminal(job_id=task.job_id)
        count += 1
    return count


def device_task_after_terminal(*, job_id: int) -> None:
    """Advance the job to its report once every device task has ended."""
    with transaction.atomic():
        job = DeploymentJob.objects.select_for_update().get(pk=job_id)
        if job.is_terminal or job.stage != "devices":
            return
        tasks = list(job.device_tasks.values_list("status", flat=True))
        done = sum(1 for s in tasks if s in TERMINAL_TASK_STATUSES)
        job_progress(job=job, progress=0.6 + 0.35 * done / max(1, len(tasks)))
        if done == len(tasks):
            job_stage_finish(job=job, stage="devices", message=f"{len(tasks)} device task(s) finished")
            job.stage = "report"
            job.save(update_fields=["stage", "updated_at"])
            enqueue_stage(job_id=job.id, stage="collect")
