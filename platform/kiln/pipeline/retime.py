"""The finalists re-timed side by side on the device: which variants, the task that asks for it, and where its answer goes.

A device's first-pass timings come from separate tasks run minutes apart, and the load drifts between
them, so they cannot settle which of two close variants is faster. Once a job has nothing left to build,
each device gets one RETIME task (pinned to the agent that measured its variants): the agent compiles the
finalists again and times them in rotated, interleaved rounds until the leader separates at 95% or the
round cap is hit (kiln_contract/paired.py). Each finalist's per-round medians land in its own metrics as
`interleaved_medians_ms`, with the summary of all its rounds' samples; the report then takes every figure of a finalist's
row, the verdict, the speed-up and its interval from that one measurement set (workers/scoring.py `decide`). When the
rounds the decision rests on were busy, the decision is provisional and the finalists are re-timed once the device is
quiet (`retime_when_quiet`, at most KILN_RETIME_QUIET_ATTEMPTS times); a verdict that changes is a job event.
"""
from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from kiln.reports.selectors import device_reports
from kiln_contract.labels import effective_precision
from kiln_contract.paired import MIN_ROUNDS
from workers.quantize.round_budget import finalists_retime_seconds

from . import specs
from .models import DeploymentJob, DeviceTask, DeviceTaskPurpose, DeviceTaskStatus
from .queue import wake_agents
from .selectors import search_seconds_left
from .services import job_event_add

# Every finalist is compiled and timed in every round: more than this and a round outlasts the drift it is meant to share.
MAX_FINALISTS = 8
RETIME_ROUNDS = 30  # the cap an agent of an earlier release reads as its fixed number of rounds


def _p50(entry: dict) -> float | None:
    return (entry.get("latency_ms") or {}).get("p50")


def _fp32_per_backend(entries: list[dict]) -> list[dict]:
    """FP32 with the runtime's defaults on each backend: the reference every speed-up is stated against."""
    plain = [e for e in entries if _p50(e) and effective_precision(e["precision"], e.get("compile"), e["backend"]) == "fp32"
             and not e.get("compile")]
    return [min((e for e in plain if e["backend"] == backend), key=_p50) for backend in sorted({e["backend"] for e in plain})]


def retime_reserve(measured_by_target: dict[str, list[dict]]) -> float:
    """Seconds of the search budget the final re-timing of today's finalists will take, over every target (each device
    re-times its own: round_budget.retime_seconds); the rounds plan against what is left once it is set aside."""
    return sum(finalists_retime_seconds(finalists(entries)) for entries in measured_by_target.values())


def finalists(entries: list[dict]) -> list[dict]:
    """What one device re-times: every variant within tolerance that could win (fastest first pass first, at most
    MAX_FINALISTS), plus FP32 with runtime defaults per backend; [] when fewer than two."""
    within = sorted((e for e in entries if _p50(e) and (e.get("accuracy") or {}).get("within_tolerance")), key=_p50)
    references = _fp32_per_backend(entries)
    others = [e for e in within if e not in references]
    chosen = sorted(references + others[: max(0, MAX_FINALISTS - len(references))], key=_p50)
    return chosen if len(chosen) >= 2 else []


def job_retime_finalists(*, job) -> int:
    """Create the re-timing task of every device that has finalists, once per job; returns how many were created."""
    done = set(job.search.get("retimed") or [])
    reports, _ = device_reports(job=job)
    created = []
    with transaction.atomic():
        for report in reports:
            if report.target in done:
                continue
            done.add(report.target)
            ids = [entry["id"] for entry in finalists(report.variants)]
            tasks = {task.id: task for task in DeviceTask.objects.filter(job=job, target=report.target, pk__in=ids, status=DeviceTaskStatus.SUCCEEDED,
                                                                          purpose=DeviceTaskPurpose.MEASURE).select_related("variant")}
            measured_by = {task.leased_by_id for task in tasks.values()}
            if len(tasks) < 2 or len(measured_by) != 1:
                # Paired rounds mean one device timing all of them; a target served by several agents has no such device.
                continue
            leader = tasks[ids[0]] if ids[0] in tasks else next(iter(tasks.values()))
            retime, was_created = DeviceTask.objects.get_or_create(
                job=job, variant=leader.variant, backend=leader.backend, target=leader.target, purpose=DeviceTaskPurpose.RETIME,
                defaults={"organization": job.organization, "pinned_agent_id": leader.leased_by_id, "required_labels": leader.required_labels,
                          "retime": {"tasks": [task_id for task_id in ids if task_id in tasks], "min_rounds": MIN_ROUNDS,
                                     "rounds": settings.RETIME_MAX_ROUNDS}},
            )
            if was_created:
                created.append(retime)
        job.search["retimed"] = sorted(done)
        job.save(update_fields=["search", "updated_at"])
        if created:
            # Whatever creates a leasable task wakes its agents (kiln.fleet.lease_precheck relies on it).
            wake_agents(organization_id=job.organization_id, tasks=created)
    return len(created)


def retimed_tasks(task: DeviceTask) -> list[DeviceTask]:
    """The measure tasks a RETIME task re-times, in its order; only tasks of the same job and target count."""
    wanted = [int(task_id) for task_id in (task.retime or {}).get("tasks") or []]
    found = {t.id: t for t in DeviceTask.objects.filter(job_id=task.job_id, target=task.target, pk__in=wanted,
                                                        purpose=DeviceTaskPurpose.MEASURE).select_related("variant__artifact__blob")}
    return [found[task_id] for task_id in wanted if task_id in found]


def retime_results_store(*, task: DeviceTask, metrics: dict) -> int:
    """Put each re-timed task's rounds into its own metrics: its interleaved round medians and the summary of all its rounds'
    samples (`side_by_side`, the figures its report row shows); returns how many were stored.

    Rows naming a task outside this RETIME task's list are ignored, and every row must have the same
    number of rounds: unpaired rounds would not cancel the drift they are there to cancel. The rounds'
    quiet-window records stay on the RETIME task (its `metrics.windows`) and reach each finalist's timing.
    A later re-timing (`retime_when_quiet`) replaces what an earlier one stored: a row shows one set.
    """
    rows = {int(row["task"]): row for row in metrics.get("retime") or []}
    targets = [t for t in retimed_tasks(task) if t.id in rows]
    if len(targets) < 2 or len({len(rows[t.id]["interleaved_medians_ms"]) for t in targets}) != 1:
        return 0
    for target in targets:
        row = rows[target.id]
        stored = {key: value for key, value in (target.metrics or {}).items() if key != "side_by_side"}
        stored.update(interleaved_medians_ms=[float(v) for v in row["interleaved_medians_ms"]], retime_task=task.id)
        if row.get("latency_ms"):
            stored["side_by_side"] = {key: row.get(key) for key in ("latency_ms", "throughput_per_s", "batch_size")}
        target.metrics = stored
        target.save(update_fields=["metrics"])
    return len(targets)


def _decision_on(job, target: str) -> dict | None:
    reports, _ = device_reports(job=job)
    return next((report.details["decision"] for report in reports if report.target == target), None)


# While other jobs' tasks wait for the same device, a re-timing waits this long at most for quiet: the device serves jobs
# in turn, and a wait for load from outside Kiln must not hold everyone else's measurements.
SHARED_QUIET_WAIT_S = 20.0


def others_waiting(task: DeviceTask) -> bool:
    """Whether another job's task is queued for the device this re-timing holds."""
    others = DeviceTask.objects.filter(organization_id=task.organization_id, status=DeviceTaskStatus.QUEUED).exclude(job_id=task.job_id)
    if task.pinned_agent_id is not None:
        others = others.filter(Q(pinned_agent_id=task.pinned_agent_id) | Q(pinned_agent__isnull=True))
    return others.exists()


def quiet_wait_s(task: DeviceTask) -> float:
    """How long the agent that leases this re-timing waits for a quiet device first: what `retime_when_quiet` asked, cut
    to SHARED_QUIET_WAIT_S while another job's task is queued for the same device."""
    asked = float((task.retime or {}).get("wait_for_quiet_s") or 0.0)
    if asked <= SHARED_QUIET_WAIT_S:
        return asked
    return SHARED_QUIET_WAIT_S if others_waiting(task) else asked


def rounds_seconds(task: DeviceTask) -> float | None:
    """How long the re-timing's rounds may hold the device past their minimum rounds: KILN_RETIME_SHARED_SECONDS while
    another job's task waits for it, and an `auto` search's rounds no longer than what is left of its budget (the
    reserve its rounds set aside: `retime_reserve`); the shorter of the two, or None (only the round cap). Two finalists
    a few percent apart can take every round of the cap to separate, or never do; each round holds everyone else's
    measurements and spends the user's budget."""
    limits = [float(settings.RETIME_SHARED_SECONDS)] if others_waiting(task) else []
    if task.job.precisions == [specs.AUTO]:
        limits.append(max(0.0, search_seconds_left(task.job)))
    return min(limits) if limits else None


def retime_when_quiet(*, task: DeviceTask, metrics: dict, agent_name: str) -> bool:
    """After a RETIME task's rounds are stored: when the decision they give is provisional (its rounds were busy, workers/scoring.py
    `provisional`) and attempts are left, queue the task again with a wait for a quiet device first; True when it did.

    Each attempt's decision is remembered (`job.search["provisional"]`), so a verdict that changes from one to the next is
    said as a job event; when no attempt is left the decision stays provisional and says so.
    """
    # The job row is locked: job.search is written by other steps of the pipeline too.
    job = DeploymentJob.objects.select_for_update().get(pk=task.job_id)
    attempt = int((task.retime or {}).get("quiet_attempt") or 0)
    # Which attempt these rounds were (the decision says how many waited for a quiet device); the task's plan moves on below.
    DeviceTask.objects.filter(pk=task.pk).update(metrics={**metrics, "quiet_attempt": attempt})
    decision = _decision_on(job, task.target)
    if decision is None:
        return False
    said = job.search.setdefault("provisional", {})
    earlier = said.get(task.target)
    if earlier and earlier["variant"] != decision["variant"]:
        job_event_add(job=job, stage="devices", level="warning", task_id=task.id,
                      message=f"{agent_name}: the verdict changed when the finalists were re-timed: it was {earlier['label']} "
                              f"({earlier['short']}), it is now {decision['label']} ({decision['short']}).")
    busy = decision.get("provisional")
    said[task.target] = {"variant": decision["variant"], "label": decision["label"], "short": decision["short"], "attempt": attempt,
                         "provisional": bool(busy)}
    again = bool(busy) and attempt < settings.RETIME_QUIET_ATTEMPTS and task.pinned_agent_id is not None
    if again:
        DeviceTask.objects.filter(pk=task.pk).update(
            status=DeviceTaskStatus.QUEUED, leased_by=None, lease_expires_at=None, finished_at=None, stage="queued",
            message="waiting for a quiet device", progress=0.0,
            retime={**(task.retime or {}), "quiet_attempt": attempt + 1, "wait_for_quiet_s": settings.RETIME_QUIET_WAIT_S})
        job_event_add(job=job, stage="devices", level="warning", task_id=task.id,
                      message=f"{agent_name}: the decision is {busy['text']}; re-timing the finalists once the device is quiet "
                              f"(attempt {attempt + 1} of {settings.RETIME_QUIET_ATTEMPTS}, waiting up to {settings.RETIME_QUIET_WAIT_S} s).")
        wake_agents(organization_id=task.organization_id, tasks=[task])
    elif busy and attempt:
        job_event_add(job=job, stage="devices", level="warning", task_id=task.id,
                      message=f"{agent_name}: the device was still busy after {attempt} re-timing(s); the decision stays {busy['text']}.")
    job.save(update_fields=["search", "updated_at"])
    return again

