"""Writes for the fleet: enrol agents, hand out device tasks under leases, take results."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from kiln.core.errors import Conflict, KilnError
from kiln.core.tokens import issue_token
from kiln.pipeline.models import (
    TERMINAL_TASK_STATUSES,
    Artifact,
    ArtifactKind,
    DeploymentJob,
    DeviceTask,
    DeviceTaskStatus,
    JobStatus,
    VariantStatus,
)
from kiln.pipeline.services import artifact_store, enqueue_stage, job_event_add, job_fail, job_progress, job_stage_finish, job_stage_start

from .models import Agent, RegistrationToken
from .selectors import AGENT_TOKEN_PREFIX, REGISTRATION_TOKEN_PREFIX, registration_token_from_secret

logger = logging.getLogger(__name__)

MAX_LOG_CHARS = 64 * 1024


# -- enrolment ------------------------------------------------------------------------------

def registration_token_create(*, organization, user, name: str) -> tuple[RegistrationToken, str]:
    issued = issue_token(REGISTRATION_TOKEN_PREFIX)
    token = RegistrationToken.objects.create(
        organization=organization, name=name or "agents", lookup_prefix=issued.lookup_prefix, digest=issued.digest, created_by=user
    )
    return token, issued.secret


def registration_token_revoke(*, token: RegistrationToken) -> RegistrationToken:
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token


def agent_register(*, registration_secret: str, name: str, labels: dict, capabilities: dict) -> tuple[Agent, str]:
    """Enrol an agent with an organization's registration token; its own token is shown once."""
    registration = registration_token_from_secret(secret=registration_secret or "")
    if registration is None:
        raise KilnError("Invalid or revoked registration token.", code="invalid_registration_token", status_code=401)
    issued = issue_token(AGENT_TOKEN_PREFIX)
    agent = Agent.objects.create(
        organization=registration.organization,
        name=name[:120],
        labels={str(k): str(v) for k, v in (labels or {}).items()},
        capabilities=capabilities or {},
        lookup_prefix=issued.lookup_prefix,
        digest=issued.digest,
        registration_token=registration,
        last_heartbeat_at=timezone.now(),
    )
    return agent, issued.secret


def agent_revoke(*, agent: Agent) -> Agent:
    """Revoke an agent: its token stops working and its leased tasks go back to the queue."""
    with transaction.atomic():
        agent.revoked_at = timezone.now()
        agent.save(update_fields=["revoked_at"])
        DeviceTask.objects.filter(leased_by=agent, status=DeviceTaskStatus.LEASED).update(
            status=DeviceTaskStatus.QUEUED, leased_by=None, lease_expires_at=None, stage="requeued", message="agent revoked"
        )
    return agent


def agent_heartbeat(*, agent: Agent, capabilities: dict | None, running_task: int | None) -> list[int]:
    """Record that an agent is alive; answer which of its tasks it must stop."""
    now = timezone.now()
    updates = {"last_heartbeat_at": now}
    if capabilities:
        updates["capabilities"] = capabilities
    Agent.objects.filter(pk=agent.pk).update(**updates)
    requeue_expired_leases()
    canceled = DeviceTask.objects.filter(leased_by=agent, status=DeviceTaskStatus.CANCELED, lease_expires_at__gt=now)
    cancel = set(canceled.values_list("id", flat=True))
    if running_task:
        # A task the agent still runs but no longer holds (lease lost, job failed) must stop too.
        still_held = DeviceTask.objects.filter(pk=running_task, leased_by=agent, status=DeviceTaskStatus.LEASED).exists()
        if not still_held:
            cancel.add(int(running_task))
    return sorted(cancel)


# -- leasing --------------------------------------------------------------------------------

def requeue_expired_leases() -> int:
    """Return tasks whose lease ran out to the queue; give up after the last attempt."""
    now = timezone.now()
    expired = DeviceTask.objects.filter(status=DeviceTaskStatus.LEASED, lease_expires_at__lt=now)
    count = 0
    for task in expired.select_related("job"):
        if task.attempt >= settings.DEVICE_TASK_MAX_ATTEMPTS:
            changed = DeviceTask.objects.filter(pk=task.pk, status=DeviceTaskStatus.LEASED, attempt=task.attempt).update(
                status=DeviceTaskStatus.FAILED, error=f"The lease expired {task.attempt} times; the device stopped answering.", finished_at=now
            )
            if changed:
                device_task_after_terminal(job_id=task.job_id)
        else:
            changed = DeviceTask.objects.filter(pk=task.pk, status=DeviceTaskStatus.LEASED, attempt=task.attempt).update(
                status=DeviceTaskStatus.QUEUED, leased_by=None, lease_expires_at=None, stage="requeued",
                message=f"lease of attempt {task.attempt} expired",
            )
            if changed:
                job_event_add(job=task.job, stage="devices", level="warning", message=f"Device task {task.id} ({task.backend}) lost its agent; requeued.")
        count += changed
    return count


def _labels_match(required: dict, labels: dict) -> bool:
    return all(labels.get(key) == value for key, value in (required or {}).items())


def _lease_candidates(agent: Agent):
    queryset = DeviceTask.objects.filter(
        organization_id=agent.organization_id,
        status=DeviceTaskStatus.QUEUED,
        backend__in=sorted(agent.backends),
        job__status__in=[JobStatus.RUNNING],
    ).order_by("id")
    if connection.features.has_select_for_update_skip_locked:
        queryset = queryset.select_for_update(skip_locked=True, of=("self",))
    return queryset


def _try_lease(agent: Agent) -> DeviceTask | None:
    now = timezone.now()
    with transaction.atomic():
        for task in _lease_candidates(agent)[:50]:
            if task.pinned_agent_id not in (None, agent.id) or not _labels_match(task.required_labels, agent.labels):
                continue
            # Compare-and-set: on databases without SKIP LOCKED only one agent wins the row.
            won = DeviceTask.objects.filter(pk=task.pk, status=DeviceTaskStatus.QUEUED).update(
                status=DeviceTaskStatus.LEASED,
                leased_by=agent,
                attempt=F("attempt") + 1,
                lease_expires_at=now + timedelta(seconds=settings.AGENT_LEASE_SECONDS),
                started_at=now,
                stage="leased",
                message=f"leased by {agent.name}",
                error="",
            )
            if won:
                return DeviceTask.objects.select_related("variant__artifact__blob", "job__validation_blob", "job__reference_blob").get(pk=task.pk)
    return None


def device_task_lease(*, agent: Agent, wait_s: float) -> DeviceTask | None:
    """Long-poll for a task this agent can run; None after `wait_s` seconds without one."""
    # A single-task agent asking for work holds nothing: hand back what it held before (a restart).
    DeviceTask.objects.filter(leased_by=agent, status=DeviceTaskStatus.LEASED).update(
        status=DeviceTaskStatus.QUEUED, leased_by=None, lease_expires_at=None, stage="requeued", message="agent restarted"
    )
    Agent.objects.filter(pk=agent.pk).update(last_heartbeat_at=timezone.now())
    deadline = time.monotonic() + max(0.0, min(wait_s, settings.AGENT_LONG_POLL_SECONDS))
    while True:
        requeue_expired_leases()
        jobs_redispatch_waiting(organization_id=agent.organization_id)
        task = _try_lease(agent)
        if task is not None or time.monotonic() >= deadline:
            return task
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


# -- progress and results -------------------------------------------------------------------

def device_task_for_agent(*, agent: Agent, task_id: int, attempt: int | None) -> DeviceTask:
    """The task an agent names, checked: its organization (else 404), its lease and attempt (else 409)."""
    task = DeviceTask.objects.select_related("job", "variant").filter(pk=task_id, organization_id=agent.organization_id).first()
    if task is None:
        raise KilnError("Not found.", code="not_found", status_code=404)
    if task.leased_by_id != agent.id:
        raise Conflict("This agent does not hold that task.", code="not_leased")
    if attempt is not None and int(attempt) != task.attempt:
        raise Conflict(f"Attempt {attempt} is stale; the task is on attempt {task.attempt}.", code="stale_attempt")
    return task


def device_task_progress(*, agent: Agent, task_id: int, attempt: int, stage: str, message: str, percent: float | None) -> dict:
    task = device_task_for_agent(agent=agent, task_id=task_id, attempt=attempt)
    if task.status == DeviceTaskStatus.CANCELED:
        return {"cancel": True, "lease_expires_at": task.lease_expires_at}
    if task.status != DeviceTaskStatus.LEASED:
        raise Conflict("The task is no longer leased.", code="not_leased")
    expires = timezone.now() + timedelta(seconds=settings.AGENT_LEASE_SECONDS)
    DeviceTask.objects.filter(pk=task.pk, status=DeviceTaskStatus.LEASED, attempt=task.attempt).update(
        stage=(stage or "")[:32], message=(message or "")[:2000], progress=max(0.0, min(1.0, (percent or 0) / 100.0)), lease_expires_at=expires
    )
    Agent.objects.filter(pk=agent.pk).update(last_heartbeat_at=timezone.now())
    return {"cancel": False, "lease_expires_at": expires}


def device_task_store_artifact(*, agent: Agent, task_id: int, attempt: int, path: Path, filename: str) -> Artifact:
    task = device_task_for_agent(agent=agent, task_id=task_id, attempt=attempt)
    if task.status != DeviceTaskStatus.LEASED:
        raise Conflict("The task is no longer leased.", code="not_leased")
    suffix = Path(filename or "").suffix[:16] or ".bin"
    artifact = artifact_store(
        job=task.job, kind=ArtifactKind.COMPILED, name=f"{task.variant.key}-{task.backend}-task{task.id}{suffix}",
        path=path, precision=task.variant.precision, backend=task.backend,
    )
    DeviceTask.objects.filter(pk=task.pk).update(compiled_artifact=artifact)
    return artifact


def device_task_result(*, agent: Agent, task_id: int, attempt: int, status: str, error: str, metrics: dict, accuracy: dict, profile: dict, log: str) -> DeviceTask:
    """Store an agent's result for the attempt it holds; a stale or repeated one changes nothing."""
    if status == HANDED_BACK:
        return device_task_hand_back(agent=agent, task_id=task_id, attempt=attempt)
    if status not in (DeviceTaskStatus.SUCCEEDED, DeviceTaskStatus.FAILED):
        raise KilnError("status must be succeeded, failed or handed_back.", code="invalid")
    with transaction.atomic():
        task = device_task_for_agent(agent=agent, task_id=task_id, attempt=attempt)
        if task.status == DeviceTaskStatus.CANCELED:
            raise Conflict("The task was canceled.", code="canceled")
        changed = DeviceTask.objects.filter(pk=task.pk, status=DeviceTaskStatus.LEASED, attempt=task.attempt, leased_by=agent).update(
            status=status,
            error=(error or "")[:10000],
            metrics=metrics or {},
            accuracy=accuracy or {},
            profile=profile or {},
            log=(log or "")[-MAX_LOG_CHARS:],
            stage="done",
            message=_result_summary(status, metrics or {}, error),
            progress=1.0,
            finished_at=timezone.now(),
        )
        if not changed:
            raise Conflict("The task is no longer leased by this attempt.", code="stale_attempt")
        task.refresh_from_db()
        level = "info" if status == DeviceTaskStatus.SUCCEEDED else "error"
        detail = "" if status == DeviceTaskStatus.SUCCEEDED else f": {error}"
        job_event_add(job=task.job, stage="devices", level=level, message=f"{agent.name}: {task.variant.key} on {task.backend} {status}{detail}")
        device_task_after_terminal(job_id=task.job_id)
    return task


HANDED_BACK = "handed_back"


def _result_summary(status: str, metrics: dict, error: str) -> str:
    """One line for the task list: the measured latency, or why it failed."""
    if status != DeviceTaskStatus.SUCCEEDED:
        return (error or "failed")[:2000]
    p50 = (metrics.get("latency_ms") or {}).get("p50")
    return f"p50 {p50:.3f} ms" if isinstance(p50, (int, float)) else "measured"


def device_task_hand_back(*, agent: Agent, task_id: int, attempt: int) -> DeviceTask:
    """A stopping agent returns its task: it goes back to the queue now, not after the lease runs out."""
    with transaction.atomic():
        task = device_task_for_agent(agent=agent, task_id=task_id, attempt=attempt)
        changed = DeviceTask.objects.filter(pk=task.pk, status=DeviceTaskStatus.LEASED, attempt=task.attempt, leased_by=agent).update(
            status=DeviceTaskStatus.QUEUED, leased_by=None, lease_expires_at=None, stage="requeued", message=f"handed back by {agent.name}"
        )
        if not changed:
            raise Conflict("The task is no longer leased by this attempt.", code="stale_attempt")
        job_event_add(job=task.job, stage="devices", level="warning", message=f"{agent.name} stopped and handed back task {task.id}; it is queued again.")
    task.refresh_from_db()
    return task


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


# -- dispatch -------------------------------------------------------------------------------

@dataclass
class Target:
    key: str
    pinned_agent: Agent | None
    labels: dict = field(default_factory=dict)
    backends: set = field(default_factory=set)


def resolve_targets(job: DeploymentJob) -> tuple[list[Target], list[str]]:
    """Turn a job's targets into concrete device groups; also say which targets found no agent."""
    agents = Agent.objects.filter(organization=job.organization, revoked_at__isnull=True)
    if not job.targets:
        return [Target(f"agent:{a.id}", a, {}, a.backends) for a in agents if a.online], []
    resolved, missing = [], []
    for target in job.targets:
        if isinstance(target, int):
            agent = agents.filter(pk=target).first()
            if agent is None:
                missing.append(f"agent {target}")
            else:
                resolved.append(Target(f"agent:{agent.id}", agent, {}, agent.backends))
            continue
        key, _, value = target.partition("=")
        matching = [a for a in agents if a.labels.get(key) == value]
        if not matching:
            missing.append(target)
            continue
        backends = set().union(*(a.backends for a in matching))
        resolved.append(Target(f"label:{target}", None, {key: value}, backends))
    return resolved, missing


def job_dispatch_device_tasks(*, job: DeploymentJob) -> None:
    """Create one device task per (variant x target x backend both support)."""
    targets, missing = resolve_targets(job)
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
    created = 0
    with transaction.atomic():
        for target in targets:
            for variant in variants:
                for backend in sorted(set(variant.backends) & target.backends):
                    _, was_created = DeviceTask.objects.get_or_create(
                        job=job, variant=variant, backend=backend, target=target.key,
                        defaults={"organization": job.organization, "pinned_agent": target.pinned_agent, "required_labels": target.labels},
                    )
                    created += was_created
        if not job.device_tasks.exists():
            offered = sorted(set().union(*(t.backends for t in targets)))
            needed = sorted(set().union(*(set(v.backends) for v in variants)))
            job_fail(job=job, stage="dispatch", message=f"No target device can run any variant: devices offer {offered or 'no runtime'}, variants need {needed}.")
            return
        job.status = JobStatus.RUNNING
        job.save(update_fields=["status", "updated_at"])
        job_stage_finish(job=job, stage="dispatch", message=f"{created} device task(s) for {len(targets)} target(s)")
        job_stage_start(job=job, stage="devices")
        job_event_add(job=job, stage="dispatch", message=f"Dispatched {created} device task(s) to {', '.join(t.key for t in targets)}.")
    device_task_after_terminal(job_id=job.id)


def jobs_redispatch_waiting(*, organization_id: int) -> None:
    for job in DeploymentJob.objects.filter(organization_id=organization_id, status=JobStatus.WAITING_FOR_DEVICES, stage="dispatch"):
        job_dispatch_device_tasks(job=job)
