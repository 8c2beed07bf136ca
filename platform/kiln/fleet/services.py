"""Writes for the fleet: enrol agents, match them with device tasks under leases, take their results.

Status changes of device tasks are `kiln.pipeline.device_tasks`'s; this module checks who may
do what and calls it.
"""
from __future__ import annotations

import logging
import time
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from kiln.core import metrics, notify
from kiln.core.db import run_in_db_thread
from kiln.core.errors import Conflict, KilnError
from kiln.core.tokens import issue_token, token_revoke
from kiln.pipeline.device_tasks import (
    HANDED_BACK,
    device_task_finish,
    device_task_requeue,
    device_task_start,
    device_tasks_release_retimes,
    device_tasks_requeue_held_by,
)
from kiln.pipeline.models import Artifact, ArtifactKind, DeviceTask, DeviceTaskPurpose, DeviceTaskStatus
from kiln.pipeline.retime import rounds_seconds
from kiln.pipeline.services import artifact_store
from kiln.registry.selectors import upload_get
from kiln.registry.services import upload_consume

from . import intervals, lease_precheck, token_cache
from .heartbeats import agent_seen_online, heartbeat_record, heartbeats_pending
from .models import Agent, RegistrationToken
from .selectors import (
    AGENT_TOKEN_PREFIX,
    REGISTRATION_TOKEN_PREFIX,
    agent_cancel_list,
    agent_holds_tasks,
    lease_candidates,
    organization_has_queued_tasks,
    registration_token_from_secret,
)

logger = logging.getLogger(__name__)

MAX_LOG_CHARS = 64 * 1024


# -- enrolment ------------------------------------------------------------------------------

def registration_token_create(*, organization, user, name: str, expires_at=None) -> tuple[RegistrationToken, str]:
    """A registration token (its secret shown once); with `expires_at`, it enrols nothing from then on."""
    issued = issue_token(REGISTRATION_TOKEN_PREFIX)
    token = RegistrationToken.objects.create(
        organization=organization, name=name or "agents", lookup_prefix=issued.lookup_prefix, digest=issued.digest, created_by=user,
        expires_at=expires_at,
    )
    return token, issued.secret


def registration_token_revoke(*, token: RegistrationToken) -> RegistrationToken:
    return token_revoke(token)


def agent_register(*, registration_secret: str, name: str, labels: dict, capabilities: dict) -> tuple[Agent, str]:
    """Enrol an agent with an organization's registration token; its own token is shown once.

    One row and nothing else (no transaction, no message to the workers): a fleet coming up is
    hundreds of registrations at once. Jobs waiting for a device are dispatched by the
    housekeeping (`redispatch_waiting`, every KILN_HOUSEKEEPING_SECONDS), which sees the new agent.
    """
    registration = registration_token_from_secret(secret=registration_secret or "")
    if registration is None:
        raise KilnError("Invalid or revoked registration token.", code="invalid_registration_token", status_code=401)
    if registration.expired:
        raise KilnError(f"This registration token expired on {registration.expires_at:%Y-%m-%d %H:%M} UTC and enrols no device; "
                        "ask an owner of the organization for a new one (Devices page, or `kiln devices add`).",
                        code="registration_token_expired", status_code=401)
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
    intervals.fleet_count_refresh()
    return agent, issued.secret


def agent_revoke(*, agent: Agent) -> Agent:
    """Revoke an agent: its token stops working and its leased tasks go back to the queue."""
    with transaction.atomic():
        agent.revoked_at = timezone.now()
        agent.save(update_fields=["revoked_at"])
        device_tasks_requeue_held_by(agent=agent, reason="agent revoked")
        device_tasks_release_retimes(agent_ids=[agent.pk], reason=f"{agent.name} was revoked")
    # This process refuses the token from now on; the others within AGENT_AUTH_CACHE_SECONDS.
    token_cache.agent_forget(agent.pk)
    return agent


def agent_heartbeat_idle(*, agent: Agent, capabilities: dict | None, running_task: int | None) -> bool:
    """The heartbeat of an online agent that runs nothing and changed nothing: noted in memory, no query.

    False when it needs `agent_heartbeat` (a running task to check, new capabilities, back from offline).
    """
    if running_task or (capabilities and capabilities != agent.capabilities) or _agent_back(agent):
        return False
    heartbeat_record(agent_id=agent.pk, at=timezone.now())
    return True


def _agent_back(agent: Agent) -> bool:
    """Whether an agent that calls now was offline (or silent long enough to count as such)."""
    return agent.offline_since is not None or not agent_seen_online(agent)


def agent_seen(*, agent: Agent, capabilities: dict | None = None) -> None:
    """Note that an agent is alive: a heartbeat, or a lease long-poll, which is an idle agent's heartbeat.

    In memory (written by the heartbeat flusher) unless the agent comes back from offline or
    brings new capabilities: then written at once. Jobs that waited for it are dispatched by the
    housekeeping (`redispatch_waiting`), as for a new agent.
    """
    if _agent_back(agent) or (capabilities and capabilities != agent.capabilities):
        updates = {"last_heartbeat_at": timezone.now(), "offline_since": None}
        if capabilities:
            updates["capabilities"] = capabilities
        Agent.objects.filter(pk=agent.pk).update(**updates)
        token_cache.agent_forget(agent.pk)
    else:
        heartbeat_record(agent_id=agent.pk, at=timezone.now())


def agent_heartbeat(*, agent: Agent, capabilities: dict | None, running_task: int | None) -> list[int]:
    """Record that an agent is alive; extend the lease of the task it runs and holds (a stage may outlast a lease: a
    TensorRT build, a first import on a slow device); answer which of its tasks it must stop."""
    agent_seen(agent=agent, capabilities=capabilities)
    intervals.fleet_count_refresh()
    now = timezone.now()
    if running_task:
        device_task_lease_extend(agent=agent, task_id=int(running_task), now=now)
    return agent_cancel_list(agent=agent, running_task=running_task, now=now)


def device_task_lease_extend(*, agent: Agent, task_id: int, now) -> bool:
    """The lease of a task this agent holds runs AGENT_LEASE_SECONDS from `now`, if the agent reported progress on it
    within AGENT_SILENT_STAGE_SECONDS (else its stage is taken as hung and the lease runs out); False when not extended."""
    expires = now + timedelta(seconds=settings.AGENT_LEASE_SECONDS)
    silent_since = now - timedelta(seconds=settings.AGENT_SILENT_STAGE_SECONDS)
    held = DeviceTask.objects.filter(pk=task_id, leased_by=agent, status=DeviceTaskStatus.LEASED, reported_at__gte=silent_since)
    return bool(held.update(lease_expires_at=expires))


def agents_mark_offline() -> int:
    """Mark agents whose heartbeat stopped as offline (idempotent; several hosts may run it)."""
    cutoff = timezone.now() - timedelta(seconds=settings.AGENT_OFFLINE_AFTER_SECONDS)
    silent = Agent.objects.filter(revoked_at__isnull=True, offline_since__isnull=True, last_heartbeat_at__lt=cutoff)
    silent = silent.exclude(pk__in=[agent_id for agent_id, seen in heartbeats_pending().items() if seen >= cutoff])
    names = list(silent.values_list("name", flat=True)[:20])
    ids = list(silent.values_list("pk", flat=True))
    count = silent.update(offline_since=timezone.now())
    if count:
        logger.info("%d agent(s) went offline: %s", count, ", ".join(names))
        device_tasks_release_retimes(agent_ids=ids, reason="its device went offline")
    return count


# -- leasing --------------------------------------------------------------------------------

def device_task_lease_begin(*, agent: Agent) -> None:
    """An agent asking for work is alive (the long-poll is its heartbeat) and holds nothing: hand
    back what it held before (it restarted, or lost the answer that leased it).

    Reads first and writes only when there is something to change: on SQLite every write waits
    for the one write lock, and a fleet asks for work all the time.
    """
    if agent_holds_tasks(agent_id=agent.pk):
        device_tasks_requeue_held_by(agent=agent, reason="agent restarted")
    agent_seen(agent=agent)
    intervals.fleet_count_refresh()


def device_task_lease_once(*, agent: Agent) -> DeviceTask | None:
    """Lease one task this agent can run, or None; never waits.

    Reads only, without a transaction, until there is something to claim: nothing to lease (the
    usual answer) takes no lock, and when nothing was published on the organization's channel
    since the last look found nothing, it does not look at all (kiln.fleet.lease_precheck). The
    claim is a compare-and-set UPDATE of one queued row (`device_task_start`): of agents racing for
    a task one wins, the others try the next candidate.
    """
    generation = notify.generation(notify.organization_channel(agent.organization_id))
    if lease_precheck.nothing_new(agent=agent, generation=generation):
        return None
    if not organization_has_queued_tasks(organization_id=agent.organization_id):
        lease_precheck.organization_found_empty(organization_id=agent.organization_id, generation=generation)
        return None
    candidates = lease_candidates(agent=agent)
    if not candidates:
        lease_precheck.agent_found_nothing(agent=agent, generation=generation)
        return None
    now = timezone.now()
    for task in candidates:
        if device_task_start(task=task, agent=agent, now=now):
            logger.info("task %s leased by %s", task.pk, agent.name, extra={"job_id": task.job_id, "task_id": task.pk, "agent_id": agent.pk})
            return DeviceTask.objects.select_related("variant__artifact__blob", "job__validation_blob", "job__reference_blob").get(pk=task.pk)
    return None


def lease_offer_fits(*, agent: Agent, offer: dict) -> bool:
    """Whether an agent could run what a wake-up offers (kiln.pipeline.queue.lease_offers)."""
    if offer.get("backend") is not None and offer["backend"] not in agent.backends:
        return False
    if offer.get("agent") not in (None, agent.id):
        return False
    labels = offer.get("labels") or {}
    return all(agent.labels.get(key) == value for key, value in labels.items())


async def device_task_lease(*, agent: Agent, wait_s: float) -> DeviceTask | None:
    """Long-poll for a task this agent can run; None after `wait_s` seconds without one.

    Between tries it sleeps on a wake-up (a task it can run became leasable in its organization),
    not on a timer, so a waiting agent costs no database work; one that leases passes the
    wake-up on, in case more tasks wait than wake-ups said.
    """
    deadline = time.monotonic() + max(0.0, min(wait_s, settings.AGENT_LONG_POLL_SECONDS))
    if deadline <= time.monotonic():
        metrics.LEASE_CHECKS.inc()
        return await run_in_db_thread(_lease_begin_and_try, agent=agent)

    def fits(offer: dict) -> bool:
        return lease_offer_fits(agent=agent, offer=offer)

    # Subscribed before the first look: a task queued between the look and the wait still wakes us.
    with notify.subscribe([notify.organization_channel(agent.organization_id)], fits) as wakeups, metrics.LEASE_WAITING.track_inprogress():
        metrics.LEASE_CHECKS.inc()
        task = await run_in_db_thread(_lease_begin_and_try, agent=agent)
        while True:
            if task is not None:
                wakeups.pass_on()
                return task
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                # Alive at the end of its wait too (in memory): a long-poll is as good as a heartbeat.
                heartbeat_record(agent_id=agent.pk, at=timezone.now())
                return None
            if await wakeups.wait(remaining):
                metrics.LEASE_WAKEUPS.inc()
            metrics.LEASE_CHECKS.inc()
            task = await run_in_db_thread(device_task_lease_once, agent=agent)


def _lease_begin_and_try(*, agent: Agent) -> DeviceTask | None:
    """The first look of a long-poll in one trip to the database thread (one pooled connection)."""
    device_task_lease_begin(agent=agent)
    return device_task_lease_once(agent=agent)


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
    """Record an agent's progress and extend its lease; the answer says whether to cancel, and to a re-timing how long its
    rounds may still hold the device (`kiln.pipeline.retime.rounds_seconds`)."""
    task = device_task_for_agent(agent=agent, task_id=task_id, attempt=attempt)
    if task.status == DeviceTaskStatus.CANCELED:
        return {"cancel": True, "lease_expires_at": task.lease_expires_at}
    if task.status != DeviceTaskStatus.LEASED:
        raise Conflict("The task is no longer leased.", code="not_leased")
    now = timezone.now()
    expires = now + timedelta(seconds=settings.AGENT_LEASE_SECONDS)
    DeviceTask.objects.filter(pk=task.pk, status=DeviceTaskStatus.LEASED, attempt=task.attempt).update(
        stage=(stage or "")[:32], message=(message or "")[:2000], progress=max(0.0, min(1.0, (percent or 0) / 100.0)), lease_expires_at=expires,
        reported_at=now,
    )
    heartbeat_record(agent_id=agent.pk, at=timezone.now())
    answer = {"cancel": False, "lease_expires_at": expires}
    if task.purpose == DeviceTaskPurpose.RETIME:
        # Asked again at every round: another job's task may have come to wait for the device since the lease.
        answer["max_seconds"] = rounds_seconds(task)
    return answer


def device_task_store_artifact(*, agent: Agent, task_id: int, attempt: int, filename: str, path: Path | None = None,
                               blob_from=None) -> Artifact:
    """Keep the engine an agent compiled as an artifact of the job: a file here, or the blob `blob_from()` makes once the lease checks out."""
    task = device_task_for_agent(agent=agent, task_id=task_id, attempt=attempt)
    if task.status != DeviceTaskStatus.LEASED:
        raise Conflict("The task is no longer leased.", code="not_leased")
    suffix = Path(filename or "").suffix[:16] or ".bin"
    artifact = artifact_store(
        job=task.job, kind=ArtifactKind.COMPILED, name=f"{task.variant.key}-{task.backend}-task{task.id}{suffix}",
        path=path, blob=blob_from() if blob_from else None, precision=task.variant.precision, backend=task.backend,
    )
    DeviceTask.objects.filter(pk=task.pk).update(compiled_artifact=artifact)
    return artifact


def device_task_store_uploaded_artifact(*, agent: Agent, task_id: int, attempt: int, upload_id, filename: str) -> Artifact:
    """Keep the engine of a finished resumable upload of this agent, only if the agent holds the task's
    lease at this attempt: anything refused (404, 409) leaves the upload as it was, for a retry."""
    with transaction.atomic():
        task = device_task_for_agent(agent=agent, task_id=task_id, attempt=attempt)
        if task.status != DeviceTaskStatus.LEASED:
            raise Conflict("The task is no longer leased.", code="not_leased")
        upload = upload_consume(upload=upload_get(organization=agent.organization, owner=f"agent:{agent.id}", upload_id=upload_id))
        return device_task_store_artifact(agent=agent, task_id=task_id, attempt=attempt, path=Path(upload.temporary_file_path()),
                                          filename=filename or upload.name)


def device_task_result(*, agent: Agent, task_id: int, attempt: int, status: str, error: str, metrics: dict, accuracy: dict, profile: dict, log: str,
                       support: dict | None = None) -> DeviceTask:
    """Store an agent's result for the attempt it holds; a stale or repeated one changes nothing."""
    if status == HANDED_BACK:
        return device_task_hand_back(agent=agent, task_id=task_id, attempt=attempt)
    if status not in (DeviceTaskStatus.SUCCEEDED, DeviceTaskStatus.FAILED):
        raise KilnError("status must be succeeded, failed or handed_back.", code="invalid")
    task = device_task_for_agent(agent=agent, task_id=task_id, attempt=attempt)
    if task.status == DeviceTaskStatus.CANCELED:
        raise Conflict("The task was canceled.", code="canceled")
    finished = device_task_finish(
        task=task, agent=agent, status=status, error=(error or "")[:10000], metrics=metrics or {}, accuracy=accuracy or {},
        profile=profile or {}, log=(log or "")[-MAX_LOG_CHARS:], summary=_result_summary(status, metrics or {}, error), support=support or {},
    )
    if not finished:
        raise Conflict("The task is no longer leased by this attempt.", code="stale_attempt")
    task.refresh_from_db()
    return task


def _result_summary(status: str, metrics: dict, error: str) -> str:
    """One line for the task list: the measured latency, or why it failed."""
    if status != DeviceTaskStatus.SUCCEEDED:
        return (error or "failed")[:2000]
    p50 = (metrics.get("latency_ms") or {}).get("p50")
    return f"p50 {p50:.3f} ms" if isinstance(p50, (int, float)) else "measured"


def device_task_hand_back(*, agent: Agent, task_id: int, attempt: int) -> DeviceTask:
    """A stopping agent returns its task: it goes back to the queue now, not after the lease runs out."""
    task = device_task_for_agent(agent=agent, task_id=task_id, attempt=attempt)
    requeued = device_task_requeue(
        task=task, reason=f"handed back by {agent.name}", event=f"{agent.name} stopped and handed back task {task.id}; it is queued again."
    )
    if not requeued:
        raise Conflict("The task is no longer leased by this attempt.", code="stale_attempt")
    task.refresh_from_db()
    return task
