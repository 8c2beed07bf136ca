"""Near-ties re-timed on the device: which variants, the task that asks for it, and where its answer goes.

A device's first-pass timings come from separate tasks run minutes apart, and on a busy device the
load drifts between them, so two variants within a few percent of each other cannot be told apart.
Once the search has nothing left to plan, each device whose recommendation rests on such a near-tie
gets one RETIME task (pinned to the agent that measured them): the agent compiles the contenders
again and times them side by side in round-robin windows, and their per-window medians land in each
contender's own metrics as `interleaved_medians_ms`, which the report's noise verdict pairs window by
window (workers/noise.py), so the drift both saw cancels.
"""
from __future__ import annotations

from django.db import transaction

from kiln.reports.selectors import device_reports
from workers.quantize.search import is_vendor_default
from workers.scoring import near_ties

from .models import DeviceTask, DeviceTaskPurpose, DeviceTaskStatus
from .queue import wake_agents

MAX_RETIMED = 6
RETIME_ROUNDS = 9


def retime_contenders(entries: list[dict]) -> list[dict]:
    """What one device re-times: its near-ties (the fastest first) and every vendor default within tolerance, at most MAX_RETIMED.

    The vendor defaults (FP32 with runtime defaults, ORT's and NNCF's INT8 defaults) join so the
    pick is judged against what a user gets without Kiln on paired rounds. [] when there is nothing to tell apart.
    """
    tied = near_ties(entries)
    if not tied:
        return []
    ids = {entry["id"] for entry in tied}
    defaults = [entry for entry in entries if entry["id"] not in ids and entry.get("latency_ms")
                and (entry.get("accuracy") or {}).get("within_tolerance") and is_vendor_default(entry)]
    contenders = [*tied, *defaults][:MAX_RETIMED]
    return contenders if len(contenders) >= 2 else []


def job_retime_near_ties(*, job) -> int:
    """Create the re-timing task of every device that needs one, once per job; returns how many were created."""
    done = set(job.search.get("retimed") or [])
    reports, _ = device_reports(job=job)
    created = []
    with transaction.atomic():
        for report in reports:
            if report.target in done:
                continue
            done.add(report.target)
            ids = [entry["id"] for entry in retime_contenders(report.variants)]
            tasks = {task.id: task for task in DeviceTask.objects.filter(job=job, target=report.target, pk__in=ids, status=DeviceTaskStatus.SUCCEEDED,
                                                                          purpose=DeviceTaskPurpose.MEASURE).select_related("variant")}
            measured_by = {task.leased_by_id for task in tasks.values()}
            if len(tasks) < 2 or len(measured_by) != 1:
                # Paired windows mean one device timing all of them; a target served by several agents has no such device.
                continue
            leader = tasks[ids[0]] if ids[0] in tasks else next(iter(tasks.values()))
            retime, was_created = DeviceTask.objects.get_or_create(
                job=job, variant=leader.variant, backend=leader.backend, target=leader.target, purpose=DeviceTaskPurpose.RETIME,
                defaults={"organization": job.organization, "pinned_agent_id": leader.leased_by_id, "required_labels": leader.required_labels,
                          "retime": {"tasks": [task_id for task_id in ids if task_id in tasks], "rounds": RETIME_ROUNDS}},
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
    """Put each re-timed task's interleaved window medians into its own metrics; returns how many were stored.

    Rows naming a task outside this RETIME task's list are ignored, and every row must have the
    same number of windows: unpaired windows would not cancel the drift they are there to cancel.
    """
    rows = {int(row["task"]): [float(v) for v in row["interleaved_medians_ms"]] for row in metrics.get("retime") or []}
    targets = [t for t in retimed_tasks(task) if t.id in rows]
    if len(targets) < 2 or len({len(rows[t.id]) for t in targets}) != 1:
        return 0
    for target in targets:
        target.metrics = {**(target.metrics or {}), "interleaved_medians_ms": rows[target.id]}
        target.save(update_fields=["metrics"])
    return len(targets)
