"""Reads for the fleet: agents, registration tokens, tokens presented by agents."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.shortcuts import get_object_or_404
from django.utils import timezone

from kiln.core.tokens import digest_matches, split_token, token_digest
from kiln.pipeline.models import DeploymentJob, DeviceTask, DeviceTaskStatus, JobStatus

from . import token_cache
from .heartbeats import heartbeats_overlay, heartbeats_pending
from .models import Agent, RegistrationToken

REGISTRATION_TOKEN_PREFIX = "kiln_reg_"
AGENT_TOKEN_PREFIX = "kiln_agt_"


def _match(queryset, secret: str, prefix: str):
    lookup = split_token(secret, prefix)
    if lookup is None:
        return None
    for row in queryset.filter(lookup_prefix=lookup):
        if digest_matches(secret, row.digest):
            return row
    return None


def registration_token_from_secret(*, secret: str) -> RegistrationToken | None:
    token = _match(RegistrationToken.objects.select_related("organization"), secret, REGISTRATION_TOKEN_PREFIX)
    return token if token is not None and token.revoked_at is None else None


def agent_from_secret(*, secret: str) -> Agent | None:
    """The live agent behind a token: from this process's token cache, else from the database."""
    if split_token(secret, AGENT_TOKEN_PREFIX) is None:
        return None
    cached = agent_from_secret_cached(secret=secret)
    if cached is not None:
        return cached
    looked_up_at = token_cache.lookup_started()
    agent = _match(Agent.objects.select_related("organization"), secret, AGENT_TOKEN_PREFIX)
    if agent is None or agent.revoked_at is not None:
        return None
    token_cache.agent_remember(token_digest(secret), agent, looked_up_at)
    return agent


def agent_from_secret_cached(*, secret: str) -> Agent | None:
    """The agent behind a token if this process checked it within AGENT_AUTH_CACHE_SECONDS; no query."""
    if split_token(secret, AGENT_TOKEN_PREFIX) is None:
        return None
    return token_cache.agent_cached(token_digest(secret))


def agent_list(*, organization):
    return Agent.objects.filter(organization=organization)


def agent_get(*, organization, agent_id: int) -> Agent:
    return get_object_or_404(Agent, organization=organization, pk=agent_id)


def registration_token_list(*, organization):
    return RegistrationToken.objects.filter(organization=organization)


def registration_token_get(*, organization, token_id: int) -> RegistrationToken:
    return get_object_or_404(RegistrationToken, organization=organization, pk=token_id)


def agent_current_task_id(agent: Agent) -> int | None:
    return DeviceTask.objects.filter(leased_by=agent, status=DeviceTaskStatus.LEASED).values_list("id", flat=True).first()


def agent_cancel_list(*, agent: Agent, running_task: int | None, now) -> list[int]:
    """Tasks the agent must stop: canceled ones it held, and one it runs but no longer holds.

    An idle agent (running nothing) has nothing to stop: no query, the common heartbeat of a fleet.
    A busy one costs one query.
    """
    if not running_task:
        return []
    rows = DeviceTask.objects.filter(leased_by=agent).filter(
        Q(status=DeviceTaskStatus.CANCELED, lease_expires_at__gt=now) | Q(pk=running_task)
    ).values_list("id", "status", "lease_expires_at")
    cancel = {task_id for task_id, status, expires in rows if status == DeviceTaskStatus.CANCELED and expires and expires > now}
    # A task the agent still runs but no longer holds (lease lost, job failed) must stop too.
    if not any(task_id == int(running_task) and status == DeviceTaskStatus.LEASED for task_id, status, _ in rows):
        cancel.add(int(running_task))
    return sorted(cancel)


def organization_has_queued_tasks(*, organization_id: int) -> bool:
    """Whether any task of the organization waits for an agent (of a running job): one small SQL query.

    Raw SQL: this runs for nearly every long-poll, and Django's query compiler costs more CPU
    than the indexed lookup itself.
    """
    with connection.cursor() as cursor:
        cursor.execute(_QUEUED_SQL, [organization_id, DeviceTaskStatus.QUEUED, JobStatus.RUNNING])
        return cursor.fetchone() is not None


def agent_holds_tasks(*, agent_id: int) -> bool:
    """Whether an agent holds a leased task (raw SQL, for the same reason)."""
    with connection.cursor() as cursor:
        cursor.execute(_HELD_SQL, [agent_id, DeviceTaskStatus.LEASED])
        return cursor.fetchone() is not None


_TASKS, _JOBS = DeviceTask._meta.db_table, DeploymentJob._meta.db_table
_QUEUED_SQL = (f"SELECT 1 FROM {_TASKS} t JOIN {_JOBS} j ON j.id = t.job_id "
               "WHERE t.organization_id = %s AND t.status = %s AND j.status = %s LIMIT 1")
_HELD_SQL = f"SELECT 1 FROM {_TASKS} WHERE leased_by_id = %s AND status = %s LIMIT 1"


def _labels_match(required: dict, labels: dict) -> bool:
    return all(labels.get(key) == value for key, value in (required or {}).items())


def lease_candidates(*, agent: Agent, limit: int = 50) -> list[DeviceTask]:
    """Queued tasks this agent may run, jobs in turn (`in_turn`): a plain read (no lock), claimed one by one by
    compare-and-set. One job's twenty measurements and its re-timing never hold another job's first measurement back. (An
    agent belongs to one organization, so its turns are between that organization's jobs.)"""
    # Every queued task's few routing fields (no cap: a cap by id would hide the newest jobs), then the first `limit` whole.
    queued = DeviceTask.objects.filter(
        organization_id=agent.organization_id,
        status=DeviceTaskStatus.QUEUED,
        backend__in=sorted(agent.backends),
        job__status__in=[JobStatus.RUNNING],
    ).only("id", "job_id", "pinned_agent_id", "required_labels")
    runnable = [task for task in queued if task.pinned_agent_id in (None, agent.id) and _labels_match(task.required_labels, agent.labels)]
    chosen = [task.id for task in in_turn(runnable)[:limit]]
    whole = DeviceTask.objects.in_bulk(chosen)
    return [whole[task_id] for task_id in chosen if task_id in whole]


# Jobs whose device time since the newest of them came differs by less than this take turns as equals.
DEVICE_TURN_QUANTUM_S = 5.0


def in_turn(tasks: list[DeviceTask]) -> list[DeviceTask]:
    """Queued tasks in the order a device serves them: fair shares of device time between jobs.

    The job that has had the least device time since the newest of these jobs came goes first (a job of short
    measurements is not held behind another's long re-timings, and a newcomer does not make up for time it was not
    there). Jobs within DEVICE_TURN_QUANTUM_S of the least served take turns: the job whose last task started longest ago
    (or never) first. Within a job, the oldest task. `kiln.pipeline.waiting` counts a waiting job's turns by this order.
    """
    served, last_turn = device_service([task.job_id for task in tasks])
    least = min(served.values(), default=0.0)
    now = timezone.now()

    def order(task: DeviceTask) -> tuple:
        service = served.get(task.job_id, 0.0)
        behind = service > least + DEVICE_TURN_QUANTUM_S
        last = last_turn.get(task.job_id)
        return (behind, service if behind else 0.0, last is not None, last or now, task.id)

    return sorted(tasks, key=order)


def device_service(job_ids: list[int]) -> tuple[dict[int, float], dict[int, object]]:
    """Per job: the seconds its tasks held a device since the newest of these jobs queued its first task (a leased task
    until now), and when its last task started."""
    rows = list(DeviceTask.objects.filter(job_id__in=set(job_ids)).values_list("job_id", "created_at", "started_at", "finished_at", "status"))
    if not rows:
        return {}, {}
    now = timezone.now()
    joined: dict[int, object] = {}
    for job_id, created, *_rest in rows:
        joined[job_id] = min(joined.get(job_id, created), created)
    since = max(joined.values())
    served: dict[int, float] = dict.fromkeys(joined, 0.0)
    last_turn: dict[int, object] = {}
    for job_id, _created, started, finished, status in rows:
        if started is None:
            continue
        last_turn[job_id] = max(last_turn.get(job_id, started), started)
        if finished is None and status != DeviceTaskStatus.LEASED:
            continue  # taken back and queued again: it holds no device now
        held_from, held_to = max(started, since), max(finished or now, started)
        served[job_id] += max(0.0, (held_to - held_from).total_seconds())
    return served, last_turn


@dataclass
class Target:
    """One device group a job measures on: a pinned agent, or any agent with some labels."""

    key: str
    pinned_agent: Agent | None
    labels: dict = field(default_factory=dict)
    backends: set = field(default_factory=set)

    @property
    def name(self) -> str:
        """What a user calls this target: the device's name, or the labels that pick the devices."""
        if self.pinned_agent is not None:
            return self.pinned_agent.name
        return "devices labelled " + ", ".join(f"{key}={value}" for key, value in sorted(self.labels.items()))


def targets_resolve(*, job: DeploymentJob) -> tuple[list[Target], list[str]]:
    """Turn a job's targets into concrete device groups; also say which targets found no agent."""
    agents = heartbeats_overlay(list(Agent.objects.filter(organization=job.organization, revoked_at__isnull=True)))
    if not job.targets:
        return [Target(f"agent:{a.id}", a, {}, a.backends) for a in agents if a.online], []
    resolved, missing = [], []
    for target in job.targets:
        if isinstance(target, int):
            agent = next((a for a in agents if a.pk == target), None)
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


def agents_online_count() -> int:
    """Agents of every organization with a recent heartbeat (for /metrics)."""
    cutoff = timezone.now() - timedelta(seconds=settings.AGENT_OFFLINE_AFTER_SECONDS)
    seen_here = [agent_id for agent_id, seen in heartbeats_pending().items() if seen >= cutoff]
    return Agent.objects.filter(Q(last_heartbeat_at__gte=cutoff) | Q(pk__in=seen_here), revoked_at__isnull=True).count()
