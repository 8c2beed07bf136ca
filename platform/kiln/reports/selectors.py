"""Reads for reports: per-device scoring of a job's device tasks, and the report document."""
from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass

from django.core.cache import cache
from django.urls import reverse

from kiln.core.errors import KilnError
from kiln.pipeline.models import ArtifactKind, DeviceTask, DeviceTaskPurpose, DeviceTaskStatus, VariantStatus
from kiln.pipeline.selectors import variant_effective_precision
from kiln.registry.selectors import model_version_onnx_path
from kiln_contract.labels import effective_precision, variant_label
from kiln_contract.paired import median
from workers.cost import op_work
from workers.quantize.isa_families import isa_notes
from workers.quantize.verdicts import compile_outcomes, family_verdicts, ranking_pays
from workers.scoring import REFUSED, decide, fp32_noise, pareto_ids, score_accuracy

from .estimate import estimate_range
from .models import Measurement, Report
from .packaging import legacy_package_name

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


WINDOW_FIELDS = ("attempt", "started_at", "seconds", "waited_s", "builds_paused", "before", "after", "competing_cores", "limit_cores",
                 "busy", "busiest", "retaken")


def _windows(raw) -> list[dict]:
    """The quiet windows a result reports (devices/quiet.py `Window.as_dict`), kept to their known fields."""
    return [{key: window[key] for key in WINDOW_FIELDS if key in window} for window in raw or [] if isinstance(window, dict)]


SIDE_BY_SIDE, FIRST_PASS = "side by side", "first pass"
# Which measurement set a row's figures come from.
MEASUREMENT_SETS = (SIDE_BY_SIDE, FIRST_PASS)


def _rounds(metrics: dict) -> list[float]:
    """A finalist's per-round medians from the side-by-side re-timing (kiln.pipeline.retime); [] when it was not re-timed."""
    interleaved = metrics.get("interleaved_medians_ms")
    return [float(v) for v in interleaved if _is_number(v)] if isinstance(interleaved, list) else []


def _first_pass(metrics: dict, latency: dict | None) -> dict:
    """Every figure of the task's own benchmark (its first pass): latency, throughput, memory, load time, and the windows
    its noise is judged by (the headline batch's window medians) with the quiet windows it ran in."""
    rows = metrics.get("by_batch") or []
    medians = rows[0].get("window_medians_ms") if rows and isinstance(rows[0], dict) else None
    return {"latency_ms": latency, "throughput_per_s": metrics.get("throughput_per_s"), "batch_size": metrics.get("batch_size"),
            "peak_memory_mb": metrics.get("peak_memory_mb"), "load_ms": metrics.get("load_ms"),
            "first_inference_ms": metrics.get("first_inference_ms"),
            "window_medians_ms": [float(v) for v in medians or [] if _is_number(v)], "windows": _windows(metrics.get("windows"))}


def _side_by_side(metrics: dict, rounds: list[float], retime_windows: list[dict]) -> dict:
    """A finalist's figures from its side-by-side rounds alone: the summary of all their samples when the agent sent it (an
    agent of an earlier release sent only the round medians: then the p50 is their median and the other figures are blank,
    the first pass being shown apart)."""
    sent = metrics.get("side_by_side") or {}
    latency = _checked_latency(sent) if sent.get("latency_ms") else {"p50": median(rounds)}
    return {"latency_ms": latency, "throughput_per_s": sent.get("throughput_per_s"), "batch_size": sent.get("batch_size"),
            "peak_memory_mb": None, "load_ms": None, "first_inference_ms": None, "window_medians_ms": rounds, "windows": retime_windows}


def _measurement(metrics: dict, latency: dict | None, retime_windows: list[dict]) -> tuple[str, dict, dict]:
    """(which measurement set the row shows, its figures, the first pass): a finalist re-timed side by side shows those
    rounds alone, every other row its first pass; either way every figure of the row comes from one set."""
    first_pass = _first_pass(metrics, latency)
    rounds = _rounds(metrics)
    if latency is None or not rounds:
        return FIRST_PASS, first_pass, first_pass
    return SIDE_BY_SIDE, _side_by_side(metrics, rounds, retime_windows), first_pass


def _timing(source: str, figures: dict, rounds: list[float]) -> dict:
    """The samples the noise of the row's latency is judged by (workers/noise.py): the windows of its measurement set, and
    its per-round medians when it was re-timed side by side; with the quiet windows they were taken in."""
    timing = {"window_medians_ms": figures["window_medians_ms"], "windows": figures["windows"], "source": source}
    if rounds:
        timing["interleaved_medians_ms"] = rounds
    return timing


def _names(variant, backend: str) -> dict:
    compile_options = variant.options.get("compile") or {}
    return {"label": variant_label(key=variant.key, precision=variant.precision, backend=backend, compile_options=compile_options,
                                   options=variant.options),
            "effective_precision": effective_precision(variant.precision, compile_options, backend, variant.options)}


def _entry(task: DeviceTask, tolerance: dict, retime_windows: list[dict]) -> dict:
    metrics = task.metrics or {}
    accuracy = task.accuracy or {}
    variant = task.variant
    artifact = task.compiled_artifact or variant.artifact
    latency = _checked_latency(metrics) if task.status == DeviceTaskStatus.SUCCEEDED else None
    source, figures, first_pass = _measurement(metrics, latency, retime_windows)
    timing = _timing(source, figures, _rounds(metrics) if source == SIDE_BY_SIDE else [])
    return {
        "id": task.id,
        "task": task.id,
        "variant": variant.id,
        "key": variant.key,
        **_names(variant, task.backend),
        "backend": task.backend,
        "precision": variant.precision,
        "recipe": variant.recipe,
        "options": variant.options,
        "compile": variant.options.get("compile") or {},
        "round": variant.round,
        "status": task.status,
        "error": task.error or None,
        "agent": {"id": task.leased_by_id, "name": task.leased_by.name} if task.leased_by else None,
        # Every figure of the row from one measurement set (`measurement_set`); a re-timed row keeps its first pass apart.
        "measurement_set": source,
        "latency_ms": figures["latency_ms"],
        "throughput_per_s": figures["throughput_per_s"],
        "batch_size": figures["batch_size"],
        "load_ms": figures["load_ms"],
        "first_inference_ms": figures["first_inference_ms"],
        "peak_memory_mb": figures["peak_memory_mb"],
        "first_pass": first_pass,
        "latency_ms_first_pass": latency,
        "threads": metrics.get("threads"),
        "unstable": metrics.get("unstable"),
        "busy": any(window.get("busy") for window in timing["windows"]),
        "timing": timing,
        "size_bytes": variant.artifact.blob.size_bytes if variant.artifact else None,
        "accuracy": _scored(tolerance, accuracy),
        "profile": task.profile or {},
        "artifact": {"id": artifact.id, "sha256": artifact.blob.sha256, "download_url": reverse("artifact-download", args=[artifact.id])} if artifact else None,
        "variant_artifact": {"id": variant.artifact.id, "sha256": variant.artifact.blob.sha256, "download_url": reverse("artifact-download", args=[variant.artifact.id])} if variant.artifact else None,
    }


def _entry_or_error(task: DeviceTask, tolerance: dict, retime_windows: list[dict] | None = None) -> dict:
    """The report entry of one task (`retime_windows`: the quiet windows of its device's side-by-side rounds); a result that
    cannot be read becomes an entry with an error instead of failing the whole report."""
    try:
        return _entry(task, tolerance, retime_windows or [])
    except (UnreadableResult, TypeError, ValueError, KeyError, AttributeError) as exc:
        logger.warning("device task %s has an unreadable result: %s", task.id, exc)
        variant = task.variant
        return {
            "id": task.id, "task": task.id, "variant": variant.id, "key": variant.key, **_names(variant, task.backend), "backend": task.backend,
            "precision": variant.precision, "recipe": variant.recipe, "options": variant.options,
            "compile": variant.options.get("compile") or {}, "round": variant.round,
            "status": task.status, "error": f"The agent's result for this variant cannot be read: {exc}",
            "agent": {"id": task.leased_by_id, "name": task.leased_by.name} if task.leased_by else None,
            "latency_ms": None, "throughput_per_s": None, "load_ms": None, "peak_memory_mb": None, "size_bytes": None,
            "accuracy": {"value": None, "within_tolerance": False}, "profile": {}, "artifact": None, "variant_artifact": None,
        }


def _group_agent(tasks: list[DeviceTask]):
    pinned = next((t.pinned_agent for t in tasks if t.pinned_agent_id), None)
    return pinned or next((t.leased_by for t in tasks if t.leased_by_id), None)


def _tasks_by_target(job) -> dict[str, list[DeviceTask]]:
    tasks = DeviceTask.objects.filter(job=job, purpose=DeviceTaskPurpose.MEASURE).select_related("variant__artifact__blob", "compiled_artifact__blob", "leased_by", "pinned_agent")
    groups: dict[str, list[DeviceTask]] = defaultdict(list)
    for task in tasks:
        groups[task.target].append(task)
    return dict(sorted(groups.items()))


def _retimes_by_target(job) -> dict[str, DeviceTask]:
    """Each device's RETIME task that has rounds: one that succeeded, or one queued again or canceled after it did (its metrics
    are the rounds its finalists' rows show)."""
    return {task.target: task for task in DeviceTask.objects.filter(job=job, purpose=DeviceTaskPurpose.RETIME).exclude(metrics={})
            if (task.metrics or {}).get("retime")}


def retime_summary(task: DeviceTask | None) -> dict | None:
    """A device's side-by-side measurement (its RETIME task, kiln.pipeline.retime) as the decision reads it: rounds, why
    they stopped, the windows re-taken."""
    if task is None:
        return None
    metrics = task.metrics or {}
    rows = metrics.get("retime") or []
    return {"task": task.id, "rounds": len(rows[0]["interleaved_medians_ms"]) if rows else 0, "stopped": metrics.get("stopped"),
            "windows": _windows(metrics.get("windows")), "quiet_attempts": int(metrics.get("quiet_attempt") or 0),
            "quiet_wait": metrics.get("quiet_wait")}


def failed_builds(*, job) -> list[dict]:
    """The job's variants whose host build failed or did not apply, and each target runtime that refused a built one
    (status `refused`, one row per runtime): they never reached a device there, and the decision says why."""
    rows = []
    for variant in job.variants.filter(status__in=[VariantStatus.FAILED, VariantStatus.SKIPPED, VariantStatus.READY]).order_by("id"):
        row = {"variant": variant.id, "key": variant.key, "precision": variant.precision, "options": variant.options,
               "compile": variant.options.get("compile") or {}, "backends": variant.backends, "round": variant.round, "status": variant.status}
        if variant.status == VariantStatus.READY:
            rows += [{**row, "backends": [backend], "status": REFUSED, "error": reason}
                     for backend, reason in ((variant.recipe or {}).get("refused_backends") or {}).items()]
            continue
        error = variant.error or ("not applicable" if variant.status == VariantStatus.SKIPPED else "failed")
        rows.append({**row, "error": error if variant.status == VariantStatus.FAILED else f"not applicable: {error}"})
    return rows


@dataclass
class DeviceReport:
    target: str
    agent: object
    variants: list[dict]
    recommended: int | None
    reason: str
    details: dict


def device_reports(*, job) -> tuple[list[DeviceReport], bool]:
    """Score the job's device tasks per target, as they stand, into one decision each; also say whether any succeeded."""
    groups = _tasks_by_target(job)
    retimes = _retimes_by_target(job)
    builds = failed_builds(job=job)
    reports = []
    for target, members in groups.items():
        summary = retime_summary(retimes.get(target))
        entries = [_entry_or_error(task, job.tolerance, (summary or {}).get("windows")) for task in members]
        front = pareto_ids(entries)
        for entry in entries:
            entry["pareto"] = entry["id"] in front
        decision = decide(entries, job.tolerance, failed_builds=builds, retime=summary)
        reports.append(DeviceReport(target, _group_agent(members), entries, decision["variant"], decision["text"], {"decision": decision}))
    succeeded = any(t.status == DeviceTaskStatus.SUCCEEDED for members in groups.values() for t in members)
    return reports, succeeded


def _agent_json(agent) -> dict | None:
    if agent is None:
        return None
    return {"id": agent.id, "name": agent.name, "capabilities": agent.capabilities, "labels": agent.labels}


def _empty_decision() -> dict:
    """Every key of a decision, with nothing in it (workers/scoring.py `decide` of no entries): what a decision stored before
    some of its keys existed is completed with, so that the API's Decision always has them all."""
    return {**decide([], {}), "text": "", "noise": {"text": ""}}


def stored_decision(details: dict | None) -> dict | None:
    """The decision a report stored; a report stored before decisions existed has its verdict, why-not rows and notes instead."""
    details = details or {}
    if details.get("decision"):
        return {**_empty_decision(), **details["decision"]}
    verdict = details.get("verdict")
    if not verdict:
        return None
    notes = " ".join(note.get("text", "") for note in details.get("unstable") or [])
    empty = _empty_decision()
    decision = {**empty, **verdict, "alternatives": details.get("alternatives") or [], "noise": {"text": notes}, "measurement": None}
    return {key: decision[key] for key in empty}


def device_json(*, agent, target: str, variants: list, recommended, reason: str, final: bool, package=None, estimate=None,
                details: dict | None = None) -> dict:
    """One device's part of the report; `details` holds its decision (workers/scoring.py `decide`), which every view renders.
    The decision is told once, under `decision` (its alternatives, noise and side-by-side measurement inside it)."""
    return {
        "agent": _agent_json(agent), "target": target, "variants": variants, "recommended": recommended, "reason": reason, "final": final,
        "decision": stored_decision(details),
        "fp32_noise": fp32_noise(variants),
        "package": {"id": package.id, "name": package.name, "sha256": package.blob.sha256,
                    "download_url": reverse("artifact-download", args=[package.id])} if package else None,
        "estimate": estimate,
    }


def job_report(*, job) -> dict:
    """The stored report of a finished job; while it runs, the results measured so far."""
    stored = list(Report.objects.filter(job=job).select_related("agent"))
    if stored:
        packages = {a.name: a for a in job.artifacts.filter(kind=ArtifactKind.PACKAGE).select_related("blob")}
        devices = [
            device_json(agent=r.agent, target=r.target, variants=r.data.get("variants", []), recommended=r.recommended_task_id, reason=r.reason,
                        final=True, package=packages.get(r.data.get("package") or legacy_package_name(r.target)), estimate=r.data.get("estimate"),
                        details=r.data.get("recommendation"))
            for r in stored
        ]
    else:
        live, _ = device_reports(job=job)
        devices = [
            device_json(agent=r.agent, target=r.target, variants=r.variants, recommended=r.recommended, reason=r.reason, final=False,
                        details=r.details)
            for r in live
        ]
    return {
        "job": job.id,
        "status": job.status,
        "tolerance": job.tolerance,
        "metrics": job.metrics,
        "evaluation": job.evaluation,
        "datasets": _datasets_summary(job),
        "search": _search_summary(job, devices),
        "devices": devices,
        "toolchain": {"host": (job.toolchain or {}).get("host") or {}, "devices": device_toolchains(job=job)},
        "rerun": rerun_differences(job=job) if job.rerun_of_id else None,
    }


def _search_summary(job, devices: list[dict]) -> dict:
    """Rounds and what each tried, sensitivity (or why there is none), the time budget and, per device, why families were
    searched or dropped and which compile options won: computed from the rows the device's table shows, by the rule the
    decision uses, so every ratio in a note can be recomputed from the table (`verdicts` and `compile` say which rows).
    The job's events keep what the planner decided at the time, on what it had measured then."""
    notes, verdicts_by_device, compile_by_device = {}, {}, {}
    # Which families the targets' chip made worth searching (recorded when round 1 was planned), before the verdicts.
    isa = job.search.get("isa")
    chip_notes = isa_notes(isa) if isa is not None else []
    for device in devices:
        measured = [{**variant, "id": f"{variant.get('key')}@{variant.get('backend')}"} for variant in device.get("variants", [])]
        target = device["target"]
        verdicts_by_device[target] = family_verdicts(measured, isa=isa)
        compile_by_device[target] = compile_outcomes(measured)
        decided = (job.search.get("verdicts_decided") or {}).get(target) or {}
        notes[target] = (chip_notes + [verdict["reason"] + _decided_otherwise(verdict, decided.get(precision))
                                       for precision, verdict in verdicts_by_device[target].items()]
                         + [outcome["text"] for outcome in compile_by_device[target]])
    sensitivity = job.search.get("sensitivity") or []
    return {"auto": job.precisions == ["auto"], "rounds": job.search.get("round", 1), "tried": _rounds_tried(job), "sensitivity": sensitivity,
            "sensitivity_note": "" if sensitivity else _no_sensitivity_note(job, verdicts_by_device),
            "budget_minutes": job.search.get("budget_minutes"), "stopped": job.search.get("stopped"), "notes": notes,
            "verdicts": verdicts_by_device, "compile": compile_by_device}


def _decided_otherwise(verdict: dict, paying_then: list[str] | None) -> str:
    """Where the search, on what it had measured when it planned, judged a family otherwise than the final table does: said,
    so that a note read from the table does not claim the search went on (or stopped) where it did not."""
    if paying_then is None or sorted(paying_then) == sorted(verdict["paying_backends"]):
        return ""
    where = f"it paid on {', '.join(paying_then)}" if paying_then else "it paid nowhere"
    return f" (the search planned on its earlier measurements, where {where})"


def _rounds_tried(job) -> list[dict]:
    """Per search round, the candidates it built: each by its label's precision and recipe key, with how its build went."""
    rounds: dict[int, list[dict]] = defaultdict(list)
    for variant in job.variants.order_by("round", "key"):
        rounds[variant.round].append({"key": variant.key, "effective_precision": variant_effective_precision(variant), "backends": variant.backends,
                                      "status": variant.status, "error": variant.error[:200] if variant.error else ""})
    return [{"round": number, "variants": variants} for number, variants in sorted(rounds.items())]


def _no_sensitivity_note(job, verdicts_by_device: dict[str, dict]) -> str:
    """Why the search ranked no layers, in the words that fit this job."""
    if job.precisions != ["auto"]:
        return "Layers are ranked by sensitivity only in an auto deployment (precisions: auto)."
    if not job.calibration_dataset_id:
        return "Layers are ranked only with a calibration dataset; this deployment had none."
    if "sensitivity" in job.search:
        return "The sensitivity analysis ran but ranked no layer (see the deployment's events)."
    if not job.is_terminal:
        # A search still under way has not decided anything about INT8 refinements yet.
        return f"No layers ranked yet: the search is in round {job.search.get('round', 1)} and still running."
    int8 = [verdicts.get(precision) for verdicts in verdicts_by_device.values() for precision in ("int8", "int8-dynamic")]
    tried = [verdict for verdict in int8 if verdict]
    if tried and not any(verdict["paying_backends"] for verdict in tried):
        return ("INT8 was tried and did not pay on this device (not faster than FP32 beyond noise), so no layers were ranked: "
                "ranking only guides INT8 refinements.")
    if tried and not any(ranking_pays(verdicts) for verdicts in verdicts_by_device.values()):
        return ("INT8 paid only on a runtime whose INT8 Kiln does not refine (LiteRT), so no layers were ranked: ranking "
                "only chooses the nodes that ONNX Runtime's and OpenVINO's INT8 refinements keep in float.")
    return "No layers were ranked: the search ended before INT8 needed refining."


def _datasets_summary(job) -> dict:
    """How the job's data was fed (layout, state carried) and which calibration samples were used."""
    feeds = job.feeds or {}
    plans = {role: {"mode": plan["mode"], "format": plan["format"]} for role in ("calibration", "validation") if (plan := feeds.get(role))}
    return {**plans, "state": feeds.get("state") or {}, "calibration_subset": feeds.get("calibration_subset"),
            "calibration_used": feeds.get("calibration_used")}


# -- the performance database ----------------------------------------------------------------

def device_toolchains(*, job) -> dict:
    """Per device of a job: the runtime versions and agent version its measurements ran with."""
    toolchains: dict[str, dict] = {}
    for row in Measurement.objects.filter(job=job).values("agent_name", "backend", "backend_version", "agent_version"):
        device = toolchains.setdefault(row["agent_name"], {"agent_version": row["agent_version"], "runtimes": {}})
        device["runtimes"][row["backend"]] = row["backend_version"]
    return toolchains


def _differences(label: str, before: dict, after: dict) -> list[str]:
    return [f"{label}{name}: {before.get(name) or 'none'} → {after.get(name) or 'none'}"
            for name in sorted(set(before) | set(after)) if before.get(name) != after.get(name)]


def rerun_differences(*, job) -> dict:
    """What changed since the job this one repeats: toolchain versions, and each variant's p50."""
    earlier = job.rerun_of
    differences = _differences("host ", (earlier.toolchain or {}).get("host") or {}, (job.toolchain or {}).get("host") or {})
    before_devices, after_devices = device_toolchains(job=earlier), device_toolchains(job=job)
    for device in sorted(set(before_devices) & set(after_devices)):
        before, after = before_devices[device], after_devices[device]
        differences += _differences(f"{device} ", {"agent": before["agent_version"], **before["runtimes"]}, {"agent": after["agent_version"], **after["runtimes"]})
    before_rows = {(m.variant_key, m.backend, m.device_key): m for m in Measurement.objects.filter(job=earlier)}
    latency = []
    for row in Measurement.objects.filter(job=job).order_by("agent_name", "variant_key", "backend"):
        previous = before_rows.get((row.variant_key, row.backend, row.device_key))
        if previous is not None:
            latency.append({"variant_key": row.variant_key, "backend": row.backend, "agent": row.agent_name, "before_p50_ms": previous.p50_ms,
                            "after_p50_ms": row.p50_ms, "ratio": row.p50_ms / previous.p50_ms if previous.p50_ms else None, "regression": row.regression})
    return {"job": earlier.id, "differences": differences, "latency": latency}


PERFORMANCE_FILTERS = {
    "model": "model_id", "model_version": "model_version_id", "model_sha256": "model_sha256", "job": "job_id", "agent": "agent_id",
    "device": "device_key", "backend": "backend", "backend_version": "backend_version", "precision": "precision", "variant": "variant_key",
    "effective_precision": "effective_precision",
}
PERFORMANCE_ORDERING = {"measured_at", "-measured_at", "p50_ms", "-p50_ms", "slowdown", "-slowdown"}


def performance_list(*, organization, filters: dict):
    """Measurements of one organization, filtered by the query parameters documented in docs/api.md."""
    queryset = Measurement.objects.filter(organization=organization).select_related("baseline")
    for name, field in PERFORMANCE_FILTERS.items():
        value = filters.get(name)
        if value in (None, ""):
            continue
        if field.endswith("_id") and not str(value).isdigit():
            raise KilnError(f"{name} must be an id.", code="invalid_filter")
        queryset = queryset.filter(**{field: value})
    regression = filters.get("regression")
    if regression not in (None, ""):
        if regression not in ("true", "false"):
            raise KilnError("regression must be true or false.", code="invalid_filter")
        queryset = queryset.filter(regression=regression == "true")
    ordering = filters.get("ordering") or "-measured_at"
    if ordering not in PERFORMANCE_ORDERING:
        raise KilnError(f"ordering must be one of {', '.join(sorted(PERFORMANCE_ORDERING))}.", code="invalid_filter")
    return queryset.order_by(ordering, "-id")


def _fp32_rows(*, organization, device_key: str | None = None, backend: str | None = None, exclude_model_sha256: str | None = None):
    # What ran in FP32: an FP32 build under a bf16 hint would teach the estimate bf16's speed.
    rows = Measurement.objects.filter(organization=organization, precision="fp32", effective_precision__in=["fp32", ""]).exclude(op_work={})
    if device_key is not None:
        rows = rows.filter(device_key=device_key)
    if backend is not None:
        rows = rows.filter(backend=backend)
    if exclude_model_sha256:
        rows = rows.exclude(model_sha256=exclude_model_sha256)
    return rows


def estimate_for_device(*, organization, device_key: str, backend: str, work: dict, counts: dict,
                        exclude_model_sha256: str | None = None) -> dict | None:
    """The estimated FP32 p50 of a model with this work on one device and backend; None when nothing was measured there."""
    # Newest first: a model measured more than once is checked (leave one out) on its latest measurement.
    rows = list(_fp32_rows(organization=organization, device_key=device_key, backend=backend, exclude_model_sha256=exclude_model_sha256)
                .order_by("-measured_at", "-id").values("p50_ms", "op_work", "op_histogram", "profile_by_op_type", "model_sha256"))
    if not rows:
        return None
    estimate = estimate_range(work, counts, rows)
    if estimate is None:
        return None
    return {**estimate, "models": len({row["model_sha256"] for row in rows})}


def model_version_estimates(*, version) -> dict:
    """Estimated FP32 latency of a model version on every device and backend with measurements of other models."""
    # Shape inference of a large model takes seconds; the same bytes always have the same work.
    work = cache.get_or_set(f"kiln:op-work:{version.blob.sha256}", lambda: op_work(model_version_onnx_path(version)), 24 * 3600)
    pairs = (_fp32_rows(organization=version.organization, exclude_model_sha256=version.blob.sha256)
             .order_by("device_key", "backend", "-measured_at").values("device_key", "backend", "agent_id", "agent_name").distinct())
    seen, devices = set(), []
    for pair in pairs:
        if (pair["device_key"], pair["backend"]) in seen:
            continue
        seen.add((pair["device_key"], pair["backend"]))
        predicted = estimate_for_device(organization=version.organization, device_key=pair["device_key"], backend=pair["backend"], work=work,
                                        counts=version.op_histogram, exclude_model_sha256=version.blob.sha256)
        if predicted:
            devices.append({"agent": {"id": pair["agent_id"], "name": pair["agent_name"]}, "device": pair["device_key"], "backend": pair["backend"], **predicted})
    measured = list(Measurement.objects.filter(organization=version.organization, model_sha256=version.blob.sha256, precision="fp32")
                    .order_by("-measured_at").values("agent_name", "backend", "p50_ms", "job_id")[:20])
    return {"model_version": version.id, "work": work, "devices": devices, "measured": measured}
