"""Writes of the performance database: a measurement per successful device task, regressions, estimates.

The pipeline's report stage calls these (it owns the job and its events); the rows are the reports
app's own and outlive the job.
"""
from __future__ import annotations

from kiln.pipeline.models import DeviceTask, DeviceTaskStatus
from kiln.registry.selectors import model_version_onnx_path
from workers.cost import op_work

from .estimate import relative_error
from .models import Measurement
from .regressions import compare, measurement_timing
from .selectors import DeviceReport, estimate_for_device


def device_key(agent) -> str:
    capabilities = agent.capabilities or {}
    return f"{agent.name}|{capabilities.get('cpu_model') or ''}"


def _job_op_work(job) -> dict:
    try:
        return op_work(model_version_onnx_path(job.model_version))
    except Exception:  # an estimate is a bonus: a model the cost walk cannot read still gets measured rows
        return {}


def _measurement_values(job, task: DeviceTask, entry: dict, work: dict, recommended: bool) -> dict:
    metrics = task.metrics or {}
    # The row's latency as the report shows it (a finalist's side-by-side set), with the windows its noise is judged by, so the
    # database says what the report says and a later regression is judged by the same rule (kiln.reports.regressions).
    latency = {**(entry.get("latency_ms") or metrics.get("latency_ms") or {}),
               "window_medians_ms": list((entry.get("timing") or {}).get("window_medians_ms") or [])}
    agent = task.leased_by
    capabilities = agent.capabilities or {}
    variant = task.variant
    return {
        "organization": job.organization, "job": job, "model": job.model_version.model, "model_version": job.model_version,
        "model_name": job.model_version.model.name, "model_sha256": job.model_version.blob.sha256, "op_histogram": job.model_version.op_histogram,
        "op_work": work, "variant_key": variant.key, "variant_sha256": variant.artifact.blob.sha256 if variant.artifact else "",
        "precision": variant.precision, "effective_precision": entry.get("effective_precision") or "", "label": (entry.get("label") or "")[:300],
        "recommended": recommended, "timing_source": (entry.get("timing") or {}).get("source") or "",
        "recipe": variant.recipe, "backend": task.backend,
        "backend_version": str((capabilities.get("runtimes") or {}).get(task.backend) or ""),
        "compile_options": {"options": variant.options, "threads": metrics.get("threads"), "batch_size": metrics.get("batch_size"),
                            "benchmark": metrics.get("settings") or {}},
        "agent": agent, "agent_name": agent.name, "device_key": device_key(agent), "agent_version": str(capabilities.get("agent_version") or ""),
        "capabilities": capabilities, "latency_ms": latency, "p50_ms": float(latency["p50"]), "std_ms": float(latency.get("std") or 0.0),
        "runs": int(latency.get("count") or metrics.get("runs") or 0), "throughput_per_s": entry.get("throughput_per_s", metrics.get("throughput_per_s")),
        # Memory and load time are the build's own, measured when the task compiled and timed it alone (its first pass).
        "peak_memory_mb": metrics.get("peak_memory_mb"), "load_ms": metrics.get("load_ms"), "accuracy": entry.get("accuracy") or {},
        "profile_by_op_type": (task.profile or {}).get("by_op_type") or [], "measured_at": task.finished_at or job.updated_at,
    }


def _timing(measurement: Measurement):
    return measurement_timing(latency_ms=measurement.latency_ms, p50_ms=measurement.p50_ms, std_ms=measurement.std_ms, runs=measurement.runs)


def _flag_regression(measurement: Measurement) -> str | None:
    """Compare with the latest earlier measurement of the same series; a message when it regressed."""
    baseline = (
        Measurement.objects.filter(organization=measurement.organization, model_sha256=measurement.model_sha256, variant_key=measurement.variant_key,
                                   backend=measurement.backend, device_key=measurement.device_key, measured_at__lt=measurement.measured_at)
        .exclude(job=measurement.job).order_by("-measured_at", "-id").first()
    )
    if baseline is None:
        return None
    verdict = compare(measured=_timing(measurement), baseline=_timing(baseline))
    measurement.baseline, measurement.slowdown, measurement.regression = baseline, verdict["slowdown"], verdict["flagged"]
    measurement.save(update_fields=["baseline", "slowdown", "regression"])
    if not verdict["flagged"]:
        return None
    return (f"Regression: {measurement.variant_key} on {measurement.backend} ({measurement.agent_name}) is slower than in job "
            f"{baseline.job_id} beyond the noise of both runs: p50 {baseline.p50_ms:.3f} → {measurement.p50_ms:.3f} ms, {verdict['text']}.")


def regression_json(measurement: Measurement) -> dict | None:
    if measurement.baseline_id is None:
        return None
    baseline = measurement.baseline
    return {"flagged": measurement.regression, "slowdown": measurement.slowdown, "baseline": baseline.id, "baseline_job": baseline.job_id,
            "baseline_p50_ms": baseline.p50_ms, "baseline_backend_version": baseline.backend_version}


def measurements_record(*, job, reports: list[DeviceReport]) -> list[str]:
    """Keep every successful device task of the job as a measurement; flag regressions on the entries.

    Returns one message per regression, for the job's event log.
    """
    tasks = {t.id: t for t in DeviceTask.objects.filter(job=job, status=DeviceTaskStatus.SUCCEEDED).select_related("variant__artifact__blob", "leased_by")}
    work = _job_op_work(job) if tasks else {}
    regressions, emulated = [], {}
    for report in reports:
        for entry in report.variants:
            task = tasks.get(entry["id"])
            if task is None or task.leased_by is None or not (task.metrics or {}).get("latency_ms"):
                continue
            if task.metrics.get("emulated"):
                emulated[task.leased_by.name] = task.metrics["emulated"]
                continue
            values = _measurement_values(job, task, entry, work, recommended=entry["id"] == report.recommended)
            measurement, _ = Measurement.objects.update_or_create(device_task=task, defaults=values)
            entry["measurement"] = measurement.id
            message = _flag_regression(measurement)
            entry["regression"] = regression_json(measurement)
            if message:
                regressions.append(message)
    return regressions + [f"{name} ran emulated ({why}): its timings are not the device's speed and stay out of the performance database."
                          for name, why in emulated.items()]


def device_estimate(*, job, report: DeviceReport) -> dict | None:
    """What the performance database predicted for this device's FP32 latency, against what was measured."""
    fp32 = next((e for e in report.variants if e.get("effective_precision", e["precision"]) == "fp32" and not e.get("compile")
                 and e.get("latency_ms") and e.get("measurement")), None)
    if fp32 is None:
        return None
    measurement = Measurement.objects.get(pk=fp32["measurement"])
    predicted = estimate_for_device(organization=job.organization, device_key=measurement.device_key, backend=measurement.backend,
                                    work=measurement.op_work, counts=measurement.op_histogram, exclude_model_sha256=measurement.model_sha256)
    if predicted is None:
        return {"backend": measurement.backend, "estimated_p50_ms": None, "measured_p50_ms": measurement.p50_ms, "error": None, "coverage": 0.0,
                "models": 0, "note": "No other model was measured on this device yet."}
    return {"backend": measurement.backend, "estimated_p50_ms": predicted["p50_ms"], "measured_p50_ms": measurement.p50_ms,
            "error": relative_error(predicted["p50_ms"], measurement.p50_ms), "coverage": predicted["coverage"], "models": predicted["models"]}
