"""Reads for reports: per-device scoring of a job's device tasks, and the report document."""
from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass

from django.urls import reverse

from kiln.pipeline.models import ArtifactKind, DeviceTask, DeviceTaskStatus

from .models import Report
from .packaging import package_name
from .scoring import fp32_noise, pareto_ids, recommend, score_accuracy

logger = logging.getLogger(__name__)


class UnreadableResult(ValueError):
    """A stored result that does not have the shape the report needs (say, stored by an older
    server that did not type-check agents)."""


def _checked_latency(metrics: dict) -> dict | None:
    latency = metrics.get("latency_ms")
    if latency is None:
        return None
    if not isinstance(latency, dict):
        raise UnreadableResult("latency_ms is not an object")
    for key, value in latency.items():
        if not _is_number(value) or value < 0:
            raise UnreadableResult(f"latency_ms.{key} is not a number: {str(value)[:40]!r}")
    if "p50" not in latency:
        raise UnreadableResult("latency_ms has no p50")
    return latency


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _scored(tolerance: dict, accuracy: dict) -> dict:
    if not accuracy:
        return {"value": None, "within_tolerance": False}
    scored = score_accuracy(tolerance, accuracy)
    if scored["value"] is not None and not _is_number(scored["value"]):
        raise UnreadableResult(f"accuracy {scored['metric']} is not a number: {str(scored['value'])[:40]!r}")
    return scored


def _entry(task: DeviceTask, tolerance: dict) -> dict:
    metrics = task.metrics or {}
    accuracy = task.accuracy or {}
    variant = task.variant
    artifact = task.compiled_artifact or variant.artifact
    latency = _checked_latency(metrics) if task.status == DeviceTaskStatus.SUCCEEDED else None
    return {
        "id": task.id,
        "task": task.id,
        "variant": variant.id,
        "key": variant.key,
        "backend": task.backend,
        "precision": variant.precision,
        "recipe": variant.recipe,
        "options": variant.options,
        "round": variant.round,
        "status": task.status,
        "error": task.error or None,
        "agent": {"id": task.leased_by_id, "name": task.leased_by.name} if task.leased_by else None,
        "latency_ms": latency,
        "throughput_per_s": metrics.get("throughput_per_s"),
        "load_ms": metrics.get("load_ms"),
        "first_inference_ms": metrics.get("first_inference_ms"),
        "peak_memory_mb": metrics.get("peak_memory_mb"),
        "threads": metrics.get("threads"),
        "unstable": metrics.get("unstable"),
        "size_bytes": variant.artifact.blob.size_bytes if variant.artifact else None,
        "accuracy": _scored(tolerance, accuracy),
        "profile": task.profile or {},
        "artifact": {"id": artifact.id, "sha256": artifact.blob.sha256, "download_url": reverse("artifact-download", args=[artifact.id])} if artifact else None,
        "variant_artifact": {"id": variant.artifact.id, "sha256": variant.artifact.blob.sha256, "download_url": reverse("artifact-download", args=[variant.artifact.id])} if variant.artifact else None,
    }


def _entry_or_error(task: DeviceTask, tolerance: dict) -> dict:
    """The report entry of one task; a result that cannot be read becomes an entry with an error
    instead of failing the whole report."""
    try:
        return _entry(task, tolerance)
    except (UnreadableResult, TypeError, ValueError, KeyError, AttributeError) as exc:
        logger.warning("device task %s has an unreadable result: %s", task.id, exc)
        variant = task.variant
        return {
            "id": task.id, "task": task.id, "variant": variant.id, "key": variant.key, "backend": task.backend,
            "precision": variant.precision, "recipe": variant.recipe, "options": variant.options, "round": variant.round,
            "status": task.status, "error": f"The agent's result for this variant cannot be read: {exc}",
            "agent": {"id": task.leased_by_id, "name": task.leased_by.name} if task.leased_by else None,
            "latency_ms": None, "accuracy": {"value": None, "within_tolerance": False}, "profile": {},
            "artifact": None, "variant_artifact": None,
        }


def _group_agent(tasks: list[DeviceTask]):
    pinned = next((t.pinned_agent for t in tasks if t.pinned_agent_id), None)
    return pinned or next((t.leased_by for t in tasks if t.leased_by_id), None)


def _tasks_by_target(job) -> dict[str, list[DeviceTask]]:
    tasks = DeviceTask.objects.filter(job=job).select_related("variant__artifact__blob", "compiled_artifact__blob", "leased_by", "pinned_agent")
    groups: dict[str, list[DeviceTask]] = defaultdict(list)
    for task in tasks:
        groups[task.target].append(task)
    return dict(sorted(groups.items()))


@dataclass
class DeviceReport:
    target: str
    agent: object
    variants: list[dict]
    recommended: int | None
    reason: str


def device_reports(*, job) -> tuple[list[DeviceReport], bool]:
    """Score the job's device tasks per target, as they stand; also say whether any succeeded."""
    groups = _tasks_by_target(job)
    reports = []
    for target, members in groups.items():
        entries = [_entry_or_error(task, job.tolerance) for task in members]
        front = pareto_ids(entries)
        for entry in entries:
            entry["pareto"] = entry["id"] in front
        recommended, reason = recommend(entries, job.tolerance)
        reports.append(DeviceReport(target, _group_agent(members), entries, recommended, reason))
    succeeded = any(t.status == DeviceTaskStatus.SUCCEEDED for members in groups.values() for t in members)
    return reports, succeeded


def _agent_json(agent) -> dict | None:
    if agent is None:
        return None
    return {"id": agent.id, "name": agent.name, "capabilities": agent.capabilities, "labels": agent.labels}


def device_json(*, agent, target: str, variants: list, recommended, reason: str, final: bool, package=None) -> dict:
    return {
        "agent": _agent_json(agent), "target": target, "variants": variants, "recommended": recommended, "reason": reason, "final": final,
        "fp32_noise": fp32_noise(variants),
        "package": {"id": package.id, "name": package.name, "download_url": reverse("artifact-download", args=[package.id])} if package else None,
    }


def job_report(*, job) -> dict:
    """The stored report of a finished job; while it runs, the results measured so far."""
    stored = list(Report.objects.filter(job=job).select_related("agent"))
    if stored:
        packages = {a.name: a for a in job.artifacts.filter(kind=ArtifactKind.PACKAGE)}
        devices = [
            device_json(agent=r.agent, target=r.target, variants=r.data.get("variants", []), recommended=r.recommended_task_id, reason=r.reason,
                        final=True, package=packages.get(package_name(r.target)))
            for r in stored
        ]
    else:
        live, _ = device_reports(job=job)
        devices = [
            device_json(agent=r.agent, target=r.target, variants=r.variants, recommended=r.recommended, reason=r.reason, final=False)
            for r in live
        ]
    return {
        "job": job.id,
        "status": job.status,
        "tolerance": job.tolerance,
        "metrics": job.metrics,
        "evaluation": job.evaluation,
        "search": {"rounds": job.search.get("round", 1), "sensitivity": job.search.get("sensitivity") or []},
        "devices": devices,
    }
