"""Build the per-device reports of a job from its device tasks (idempotent)."""
from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass

from django.db import transaction
from django.urls import reverse

from kiln.pipeline.models import DeviceTask, DeviceTaskStatus

from .models import Measurement, Report
from .scoring import pareto_ids, recommend, resolve_metric, score_accuracy

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
    scored = score_accuracy(tolerance, accuracy, resolve_metric(tolerance, accuracy))
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


def _store_package(job, report: DeviceReport) -> None:
    """The recommended variant of one device, bundled for download with its report and a run script."""
    import tempfile
    from pathlib import Path

    from kiln.pipeline.models import ArtifactKind
    from kiln.pipeline.services import artifact_store

    from .packaging import build_device_package, package_name
    from .selectors import device_json

    device = device_json(agent=report.agent, target=report.target, variants=report.variants, recommended=report.recommended, reason=report.reason, final=True)
    with tempfile.TemporaryDirectory(prefix="kiln-package-") as scratch:
        path = Path(scratch) / package_name(report.target)
        if build_device_package(job=job, device=device, out_path=path):
            chosen = next(v for v in report.variants if v["id"] == report.recommended)
            artifact_store(job=job, kind=ArtifactKind.PACKAGE, name=path.name, path=path, precision=chosen["precision"], backend=chosen["backend"])


@transaction.atomic
def report_build(*, job) -> str:
    """Store the final per-device reports; raise StageFailed when nothing was measured."""
    from kiln.pipeline.stages import StageFailed

    reports, succeeded = device_reports(job=job)
    measurements_record(job=job, reports=reports)
    Report.objects.filter(job=job).delete()
    for report in reports:
        Report.objects.create(
            organization=job.organization, job=job, target=report.target, agent=report.agent,
            recommended_task_id=report.recommended, reason=report.reason,
            data={"variants": report.variants, "estimate": device_estimate(job=job, report=report)},
        )
        _store_package(job, report)
    if not succeeded:
        raise StageFailed("No device task succeeded; the report lists each error.")
    return " | ".join(f"{r.agent.name if r.agent else r.target}: {r.reason}" for r in reports)


# -- the performance database ----------------------------------------------------------------

def device_key(agent) -> str:
    capabilities = agent.capabilities or {}
    return f"{agent.name}|{capabilities.get('cpu_model') or ''}"


def _job_op_work(job) -> dict:
    from kiln.registry.selectors import model_version_onnx_path
    from workers.cost import op_work

    try:
        return op_work(model_version_onnx_path(job.model_version))
    except Exception:  # an estimate is a bonus: a model the cost walk cannot read still gets measured rows
        return {}


def _measurement_values(job, task: DeviceTask, entry: dict, work: dict) -> dict:
    metrics = task.metrics or {}
    latency = metrics.get("latency_ms") or {}
    agent = task.leased_by
    capabilities = agent.capabilities or {}
    variant = task.variant
    return {
        "organization": job.organization, "job": job, "model": job.model_version.model, "model_version": job.model_version,
        "model_name": job.model_version.model.name, "model_sha256": job.model_version.blob.sha256, "op_histogram": job.model_version.op_histogram,
        "op_work": work, "variant_key": variant.key, "variant_sha256": variant.artifact.blob.sha256 if variant.artifact else "",
        "precision": variant.precision, "recipe": variant.recipe, "backend": task.backend,
        "backend_version": str((capabilities.get("runtimes") or {}).get(task.backend) or ""),
        "compile_options": {"options": variant.options, "threads": metrics.get("threads"), "batch_size": metrics.get("batch_size"),
                            "benchmark": metrics.get("settings") or {}},
        "agent": agent, "agent_name": agent.name, "device_key": device_key(agent), "agent_version": str(capabilities.get("agent_version") or ""),
        "capabilities": capabilities, "latency_ms": latency, "p50_ms": float(latency["p50"]), "std_ms": float(latency.get("std") or 0.0),
        "runs": int(metrics.get("runs") or latency.get("count") or 0), "throughput_per_s": metrics.get("throughput_per_s"),
        "peak_memory_mb": metrics.get("peak_memory_mb"), "load_ms": metrics.get("load_ms"), "accuracy": entry.get("accuracy") or {},
        "profile_by_op_type": (task.profile or {}).get("by_op_type") or [], "measured_at": task.finished_at or job.updated_at,
    }


def _flag_regression(measurement: Measurement) -> dict | None:
    from kiln.pipeline.services import job_event_add

    from .regressions import compare

    baseline = (
        Measurement.objects.filter(organization=measurement.organization, model_sha256=measurement.model_sha256, variant_key=measurement.variant_key,
                                   backend=measurement.backend, device_key=measurement.device_key, measured_at__lt=measurement.measured_at)
        .exclude(job=measurement.job).order_by("-measured_at", "-id").first()
    )
    if baseline is None:
        return None
    verdict = compare(p50_ms=measurement.p50_ms, std_ms=measurement.std_ms, baseline_p50_ms=baseline.p50_ms, baseline_std_ms=baseline.std_ms)
    measurement.baseline, measurement.slowdown, measurement.regression = baseline, verdict["slowdown"], verdict["flagged"]
    measurement.save(update_fields=["baseline", "slowdown", "regression"])
    if verdict["flagged"]:
        job_event_add(
            job=measurement.job, stage="report", level="warning",
            message=(f"Regression: {measurement.variant_key} on {measurement.backend} ({measurement.agent_name}) is {verdict['slowdown']:.2f}x slower "
                     f"than in job {baseline.job_id}: p50 {baseline.p50_ms:.3f} → {measurement.p50_ms:.3f} ms, beyond the noise of ±{verdict['noise_ms']:.3f} ms."),
        )
    return regression_json(measurement)


def regression_json(measurement: Measurement) -> dict | None:
    if measurement.baseline_id is None:
        return None
    baseline = measurement.baseline
    return {"flagged": measurement.regression, "slowdown": measurement.slowdown, "baseline": baseline.id, "baseline_job": baseline.job_id,
            "baseline_p50_ms": baseline.p50_ms, "baseline_backend_version": baseline.backend_version}


def measurements_record(*, job, reports: list[DeviceReport]) -> None:
    """Keep every successful device task of the job as a measurement; flag regressions on the entries."""
    tasks = {t.id: t for t in DeviceTask.objects.filter(job=job, status=DeviceTaskStatus.SUCCEEDED).select_related("variant__artifact__blob", "leased_by")}
    work = _job_op_work(job) if tasks else {}
    for report in reports:
        for entry in report.variants:
            task = tasks.get(entry["id"])
            if task is None or task.leased_by is None or not (task.metrics or {}).get("latency_ms"):
                continue
            measurement, _ = Measurement.objects.update_or_create(device_task=task, defaults=_measurement_values(job, task, entry, work))
            entry["measurement"] = measurement.id
            entry["regression"] = _flag_regression(measurement)


def device_estimate(*, job, report: DeviceReport) -> dict | None:
    """What the performance database predicted for this device's FP32 latency, against what was measured."""
    from .selectors import estimate_for_device

    fp32 = next((e for e in report.variants if e["precision"] == "fp32" and e.get("latency_ms") and e.get("measurement")), None)
    if fp32 is None:
        return None
    measurement = Measurement.objects.get(pk=fp32["measurement"])
    predicted = estimate_for_device(organization=job.organization, device_key=measurement.device_key, backend=measurement.backend,
                                    work=measurement.op_work, counts=measurement.op_histogram, exclude_model_sha256=measurement.model_sha256)
    if predicted is None:
        return {"backend": measurement.backend, "estimated_p50_ms": None, "measured_p50_ms": measurement.p50_ms, "error": None, "coverage": 0.0,
                "models": 0, "note": "No other model was measured on this device yet."}
    from .estimate import relative_error

    return {"backend": measurement.backend, "estimated_p50_ms": predicted["p50_ms"], "measured_p50_ms": measurement.p50_ms,
            "error": relative_error(predicted["p50_ms"], measurement.p50_ms), "coverage": predicted["coverage"], "models": predicted["models"]}
