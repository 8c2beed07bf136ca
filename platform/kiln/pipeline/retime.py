"""The finalists re-timed side by side on the device: which variants, the task that asks for it, and where its answer goes.

A device's first-pass timings come from separate tasks run minutes apart, and the load drifts between
them, so they cannot settle which of two close variants is faster. Once a job has nothing left to build,
each device gets one RETIME task (pinned to the agent that measured its variants): the agent compiles the
finalists again and times them in rotated, interleaved rounds until the leader separates at 95% or the
round cap is hit (devices/paired.py). Each finalist's per-round medians land in its own metrics as
`interleaved_medians_ms`; the report then takes every finalist's p50, the verdict, the speed-up and its
interval from that one measurement set (workers/scoring.py `decide`).
"""
from __future__ import annotations

from django.conf import settings
from django.db import transaction

from devices.labels import effective_precision
from devices.paired import MIN_ROUNDS
from kiln.reports.selectors import device_reports

from .models import DeviceTask, DeviceTaskPurpose, DeviceTaskStatus
from .queue import wake_agents

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
    """Put each re-timed task's interleaved round medians into its own metrics; returns how many were stored.

    Rows naming a task outside this RETIME task's list are ignored, and every row must have the same
    number of rounds: unpaired rounds would not cancel the drift they are there to cancel. The rounds'
    quiet-window records stay on the RETIME task (its `metrics.windows`) and reach each finalist's timing.
    """
    rows = {int(row["task"]): [float(v) for v in row["interleaved_medians_ms"]] for row in metrics.get("retime") or []}
    targets = [t for t in retimed_tasks(task) if t.id in rows]
    if len(targets) < 2 or len({len(rows[t.id]) for t in targets}) != 1:
        return 0
    for target in targets:
        target.metrics = {**(target.metrics or {}), "interleaved_medians_ms": rows[target.id], "retime_task": task.id}
        target.save(update_fields=["metrics"])
    return len(targets)

