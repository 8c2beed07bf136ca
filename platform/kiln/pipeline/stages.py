"""The host-side stages of a job, one function per Celery task; each can run twice safely."""
from __future__ import annotations

import logging
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from django.db import transaction

from kiln.registry.models import SourceFormat
from kiln.registry.selectors import blob_file, model_version_onnx_path
from kiln.registry.services import blob_create
from workers.convert import convert_model
from workers.inspect import validate_onnx
from workers.quantize import NotApplicable, build_variant
from workers.reference import compute_reference_outputs

from . import specs
from .models import STAGES, Artifact, ArtifactKind, DeploymentJob, Variant, VariantStatus
from .services import artifact_store, enqueue_stage, job_event_add, job_fail, job_progress, job_stage_finish, job_stage_start

logger = logging.getLogger(__name__)

SYNTHETIC_SAMPLES = 16


class StageFailed(Exception):
    """A stage cannot go on for a reason the user should read."""


def _stage_index(stage: str) -> int:
    return STAGES.index(stage) if stage in STAGES else len(STAGES)


def _load_active_job(job_id: int, stage: str) -> DeploymentJob | None:
    """The job, if this stage may run now: it is the job's stage, or the one the job just finished.

    Anything else is a redelivered or stray message (a later stage already runs, or the message
    belongs to an earlier life of the broker) and is dropped.
    """
    job = DeploymentJob.objects.select_related("model_version__blob", "model_version__model", "organization").filter(pk=job_id).first()
    if job is None or job.is_terminal:
        return None
    index = _stage_index(stage)
    if _stage_index(job.stage) not in (index, index - 1):
        logger.warning("dropping %s for job %s, which is at %s", stage, job_id, job.stage)
        return None
    return job


@contextmanager
def _scratch_dir():
    path = Path(tempfile.mkdtemp(prefix="kiln-stage-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_stage(job_id: int, stage: str, body) -> bool:
    """Run one stage's body with bookkeeping; returns True when the next stage may start."""
    job = _load_active_job(job_id, stage)
    if job is None:
        return False
    job_stage_start(job=job, stage=stage)
    try:
        message = body(job) or ""
    except StageFailed as exc:
        job_fail(job=job, stage=stage, message=str(exc))
        return False
    except Exception as exc:
        from celery.exceptions import SoftTimeLimitExceeded

        if isinstance(exc, SoftTimeLimitExceeded):
            job_fail(job=job, stage=stage, message="The stage ran past its time limit.")
            return False
        logger.exception("stage %s of job %s crashed", stage, job_id)
        job_fail(job=job, stage=stage, message=f"Unexpected error: {type(exc).__name__}: {exc}")
        return False
    job.refresh_from_db()
    if job.is_terminal:
        return False
    job_stage_finish(job=job, stage=stage, message=message)
    return True


def _source_model_path(job) -> Path:
    return model_version_onnx_path(job.model_version)


def _working_model_path(job) -> Path:
    """The converted model when conversion produced one, else the upload itself."""
    if job.converted_blob_id:
        return blob_file(job.converted_blob)
    return _source_model_path(job)


# -- validate -------------------------------------------------------------------------------

def _validate(job) -> str:
    result = validate_onnx(_source_model_path(job))
    if not result["ok"]:
        raise StageFailed(f"The ONNX checker rejected the model: {result['error']}")
    return "The ONNX checker accepted the model."


def job_validate(*, job_id: int) -> None:
    if run_stage(job_id, "validate", _validate):
        enqueue_stage(job_id=job_id, stage="convert")


# -- convert --------------------------------------------------------------------------------

def _convert(job) -> str:
    if job.model_version.source_format == SourceFormat.ONNX_ZIP:
        job_event_add(job=job, stage="convert", level="warning", message="Models with external data are used as uploaded; conversion skipped.")
        return "skipped: external-data model"
    with _scratch_dir() as scratch:
        out = scratch / "converted.onnx"
        report = convert_model(_source_model_path(job), out)
        for step in report["steps"]:
            level = "info" if step["status"] == "applied" else "warning"
            reason = f": {step['reason']}" if step.get("reason") else ""
            job_event_add(job=job, stage="convert", level=level, message=f"{step['name']} {step['status']}{reason}")
        extra_files = [p for p in scratch.iterdir() if p.name != "converted.onnx"]
        if extra_files or not out.exists():
            job_event_add(job=job, stage="convert", level="warning", message="The converted model needs external data; the uploaded model is used instead.")
            return "kept the uploaded model"
        artifact = artifact_store(job=job, kind=ArtifactKind.CONVERTED, name="converted.onnx", path=out, precision="fp32")
    job.converted_blob = artifact.blob
    job.save(update_fields=["converted_blob", "updated_at"])
    applied = [s["name"] for s in report["steps"] if s["status"] == "applied"]
    return f"opset {report.get('opset')}; applied: {', '.join(applied) or 'nothing'}"


def job_convert(*, job_id: int) -> None:
    if run_stage(job_id, "convert", _convert):
        enqueue_stage(job_id=job_id, stage="reference")


# -- reference ------------------------------------------------------------------------------

def _synthetic_inputs(signature: dict, path: Path) -> None:
    """Seeded random inputs for jobs without datasets: accuracy is then measured against FP32 only."""
    rng = np.random.default_rng(0)
    arrays = {}
    for spec in signature.get("inputs", []):
        dims = [d if isinstance(d, int) and d > 0 else 1 for d in spec["shape"]]
        dims = [SYNTHETIC_SAMPLES] + dims[1:] if dims else [SYNTHETIC_SAMPLES]
        dtype = np.dtype(spec["dtype"])
        if np.issubdtype(dtype, np.floating):
            arrays[spec["name"]] = rng.standard_normal(dims).astype(dtype)
        elif dtype == np.bool_:
            arrays[spec["name"]] = rng.integers(0, 2, dims).astype(dtype)
        else:
            arrays[spec["name"]] = rng.integers(0, 8, dims).astype(dtype)
    np.savez(path, **arrays)


def _validation_inputs(job, scratch: Path) -> Path:
    if job.validation_dataset_id:
        return blob_file(job.validation_dataset.blob)
    if job.calibration_dataset_id:
        job_event_add(job=job, stage="reference", level="warning", message="No validation dataset: the calibration dataset is used to compare outputs with FP32.")
        return blob_file(job.calibration_dataset.blob)
    job_event_add(job=job, stage="reference", level="warning", message=f"No datasets: {SYNTHETIC_SAMPLES} seeded random inputs are used to compare outputs with FP32.")
    path = scratch / "synthetic-validation.npz"
    _synthetic_inputs(job.model_version.signature, path)
    return path


def _reference(job) -> str:
    with _scratch_dir() as scratch:
        inputs = _validation_inputs(job, scratch)
        out = scratch / "reference.npz"
        summary = compute_reference_outputs(_source_model_path(job), inputs, out)
        reference = artifact_store(job=job, kind=ArtifactKind.REFERENCE, name="reference-outputs.npz", path=out, precision="fp32")
        validation_blob = blob_create(organization=job.organization, path=inputs)
        job.evaluation = _evaluation_plan(job, out)
    job.reference_blob = reference.blob
    job.validation_blob = validation_blob
    job.save(update_fields=["reference_blob", "validation_blob", "evaluation", "updated_at"])
    kinds = ", ".join(f"{entry['name']}: {entry['kind']}{' (primary)' if entry['primary'] else ''}" for entry in job.evaluation["outputs"])
    job_event_add(job=job, stage="reference", message=f"Outputs judged as {kinds}.")
    return f"FP32 reference outputs on {summary['samples']} samples."


def _evaluation_plan(job, reference_path: Path) -> dict:
    """Kinds per output (the user's overrides, else inferred from the graph and FP32's values) and what each device measures."""
    from devices.contract import evaluation_plan
    from workers.inspect import infer_output_kinds

    with np.load(reference_path, allow_pickle=False) as archive:
        reference = {name: archive[name] for name in archive.files}
    kinds = infer_output_kinds(_source_model_path(job), reference)
    for name, kind in (job.model_version.output_kind_overrides or {}).items():
        if name in kinds and kinds[name]["kind"] != kind:
            kinds[name] = {"kind": kind, "reason": "set by the user", "source": "override"}
    order = [output["name"] for output in job.model_version.signature.get("outputs", []) if output["name"] in reference] or list(reference)
    has_labels = bool(job.validation_dataset_id and job.validation_dataset.has_labels)
    plan = evaluation_plan(output_kinds=kinds, output_order=order, declared=job.metrics or [], has_labels=has_labels)
    for entry in plan["outputs"]:
        entry["reason"] = kinds.get(entry["name"], {}).get("reason", "")
    return plan


def job_reference(*, job_id: int) -> None:
    if run_stage(job_id, "reference", _reference):
        enqueue_stage(job_id=job_id, stage="quantize")


# -- quantize -------------------------------------------------------------------------------

def _target_facts(job) -> tuple[list[str], list[str]]:
    """ISA flags and runtimes of the agents the job targets (all of the organization when unknown)."""
    from kiln.fleet.services import resolve_targets

    targets, _ = resolve_targets(job)
    agents = [t.pinned_agent for t in targets if t.pinned_agent] or list(job.organization.agents.filter(revoked_at__isnull=True))
    isa = sorted(set.intersection(*(set(a.capabilities.get("isa") or []) for a in agents))) if agents else []
    backends = sorted(set().union(*(a.backends for a in agents))) if agents else ["onnxruntime", "openvino"]
    return isa, backends


def _sensitivity(job) -> list[dict] | None:
    """Rank nodes by quantization error once per job; None without calibration data."""
    if "sensitivity" in job.search or not job.calibration_dataset_id:
        return job.search.get("sensitivity")
    from workers.quantize.sensitivity import rank_nodes

    try:
        ranking = rank_nodes(model_path=_working_model_path(job), calibration_path=blob_file(job.calibration_dataset.blob))
    except Exception as exc:
        job_event_add(job=job, stage="quantize", level="warning", message=f"Sensitivity analysis failed: {exc}")
        ranking = []
    job.search["sensitivity"] = ranking[:50]
    if ranking:
        top = ", ".join(f"{r['node']} ({r['sqnr_db']:.1f} dB)" for r in ranking[:3])
        job_event_add(job=job, stage="quantize", message=f"Most quantization-sensitive nodes: {top}.")
    return job.search["sensitivity"]


def _search_specs(job, *, round_number: int, measured: list[dict]) -> list[dict]:
    from workers.quantize.search import plan_round

    isa, backends = _target_facts(job)
    version = job.model_version
    return plan_round(
        round_number=round_number,
        model_facts={"signature": version.signature, "op_histogram": version.op_histogram},
        device_isa=isa,
        backends=backends,
        has_calibration=job.calibration_dataset_id is not None,
        tolerance=job.tolerance,
        sensitivity=_sensitivity(job),
        measured=measured,
    )


def _create_variants(job, specs: list[dict], *, round_number: int) -> list[str]:
    created = []
    for spec in specs:
        _, was_created = Variant.objects.get_or_create(
            job=job, key=spec["key"],
            defaults={"organization": job.organization, "precision": spec["precision"], "options": spec.get("options") or {},
                      "round": round_number, "backends": spec.get("backends") or []},
        )
        if was_created:
            created.append(spec["key"])
    return created


def _plan_variants(job) -> str:
    if job.precisions == [specs.AUTO]:
        job.search.setdefault("round", 1)
        job.search.setdefault("started_at", time.time())
        planned = _search_specs(job, round_number=1, measured=[])
        job.save(update_fields=["search", "updated_at"])
        created = _create_variants(job, planned, round_number=1)
        return f"search round 1: {len(created)} candidate(s): {', '.join(created)}"
    precisions = specs.resolve_precisions(job.precisions, has_calibration=job.calibration_dataset_id is not None)
    _create_variants(job, [{"key": p, "precision": p} for p in precisions], round_number=1)
    return f"planned {len(precisions)} variant(s): {', '.join(precisions)}"


def job_quantize(*, job_id: int) -> None:
    """Plan the variants and fan out one build task each; the last one to finish dispatches."""
    from workers import tasks

    if not run_stage_open(job_id, "quantize", _plan_variants):
        return
    for variant_id in Variant.objects.filter(job_id=job_id, status__in=[VariantStatus.PENDING, VariantStatus.BUILDING]).values_list("id", flat=True):
        transaction.on_commit(lambda vid=variant_id: tasks.variant_build.delay(vid))


def run_stage_open(job_id: int, stage: str, body) -> bool:
    """Like run_stage, but the stage stays running: fan-out tasks finish it."""
    job = _load_active_job(job_id, stage)
    if job is None:
        return False
    job_stage_start(job=job, stage=stage)
    try:
        job_event_add(job=job, stage=stage, message=body(job))
    except Exception as exc:
        logger.exception("stage %s of job %s crashed", stage, job_id)
        job_fail(job=job, stage=stage, message=f"{type(exc).__name__}: {exc}")
        return False
    return True


def _variant_cache_key(variant: Variant, job: DeploymentJob) -> str:
    from workers.quantize.cache import variant_cache_key

    model_sha = (job.converted_blob or job.model_version.blob).sha256
    calibration_sha = job.calibration_dataset.blob.sha256 if job.calibration_dataset_id else ""
    return variant_cache_key(model_sha256=model_sha, precision=variant.precision, options={**variant.options, "_calibration": calibration_sha})


def _reuse_cached(variant: Variant, job: DeploymentJob) -> bool:
    """Reuse a ready build with the same model bytes, recipe, data and toolchain versions."""
    cached = (
        Variant.objects.filter(organization=job.organization, cache_key=variant.cache_key, status=VariantStatus.READY, artifact__isnull=False)
        .exclude(pk=variant.pk).select_related("artifact__blob").order_by("-id").first()
    )
    if cached is None:
        return False
    variant.artifact, _ = Artifact.objects.update_or_create(
        job=job, kind=ArtifactKind.VARIANT, name=f"{variant.key}.onnx",
        defaults={"organization": job.organization, "blob": cached.artifact.blob, "precision": variant.precision},
    )
    variant.recipe = {**cached.recipe, "cached_from_job": cached.job_id}
    variant.backends = cached.backends
    variant.status = VariantStatus.READY
    job_event_add(job=job, stage="quantize", message=f"{variant.key}: reused the identical build of job {cached.job_id}.")
    return True


def _build_variant_artifact(variant: Variant, job: DeploymentJob) -> None:
    variant.cache_key = _variant_cache_key(variant, job)
    if _reuse_cached(variant, job):
        return
    calibration = blob_file(job.calibration_dataset.blob) if job.calibration_dataset_id else None
    with _scratch_dir() as scratch:
        out = scratch / f"{variant.key}.onnx"
        built = build_variant(
            model_path=_working_model_path(job), precision=variant.precision, out_path=out, calibration_path=calibration, options=variant.options
        )
        artifact = artifact_store(job=job, kind=ArtifactKind.VARIANT, name=f"{variant.key}.onnx", path=out, precision=variant.precision)
    variant.artifact = artifact
    variant.recipe = built.get("recipe", {})
    # The planner may restrict backends (an OpenVINO-only recipe); never widen what the build can run on.
    built_backends = built.get("backends", ["onnxruntime"])
    variant.backends = [b for b in built_backends if b in variant.backends] if variant.backends else built_backends
    variant.status = VariantStatus.READY


def variant_build(*, variant_id: int) -> None:
    """Build one host-side variant; its failure fails the variant, not the job."""
    variant = Variant.objects.select_related("job").filter(pk=variant_id).first()
    if variant is None or variant.job.is_terminal or variant.status in (VariantStatus.READY, VariantStatus.SKIPPED, VariantStatus.FAILED):
        return
    job = variant.job
    variant.status = VariantStatus.BUILDING
    variant.save(update_fields=["status"])
    try:
        _build_variant_artifact(variant, job)
        if "cached_from_job" not in variant.recipe:
            job_event_add(job=job, stage="quantize", message=f"Built {variant.key} ({variant.artifact.blob.size_bytes} bytes).")
    except NotApplicable as exc:
        variant.status, variant.error = VariantStatus.SKIPPED, str(exc)
        job_event_add(job=job, stage="quantize", level="warning", message=f"{variant.key} skipped: {exc}")
    except Exception as exc:
        logger.exception("variant %s failed", variant_id)
        variant.status, variant.error = VariantStatus.FAILED, f"{type(exc).__name__}: {exc}"
        job_event_add(job=job, stage="quantize", level="error", message=f"{variant.key} failed: {variant.error}")
    variant.save()
    _finish_quantize_if_done(job.id)


@transaction.atomic
def _finish_quantize_if_done(job_id: int) -> None:
    job = DeploymentJob.objects.select_for_update().get(pk=job_id)
    if job.is_terminal or job.stage != "quantize":
        return
    variants = list(job.variants.all())
    done = [v for v in variants if v.status in (VariantStatus.READY, VariantStatus.SKIPPED, VariantStatus.FAILED)]
    job_progress(job=job, progress=0.25 + 0.3 * len(done) / max(1, len(variants)))
    if len(done) < len(variants):
        return
    ready = [v for v in variants if v.status == VariantStatus.READY]
    if not any(v.status == VariantStatus.READY for v in variants if v.round == job.search.get("round", 1)) and job.search.get("round", 1) > 1:
        job_event_add(job=job, stage="quantize", level="warning", message="No candidate of this round could be built; reporting what was measured.")
        job_stage_finish(job=job, stage="quantize", message="round without new variants")
        job.stage = "report"
        job.save(update_fields=["stage", "updated_at"])
        enqueue_stage(job_id=job_id, stage="report")
        return
    if not ready:
        reasons = "; ".join(f"{v.key}: {v.error}" for v in variants)
        job_fail(job=job, stage="quantize", message=f"No variant could be built. {reasons}")
        return
    job_stage_finish(job=job, stage="quantize", message=f"{len(ready)} of {len(variants)} variants built")
    enqueue_stage(job_id=job_id, stage="dispatch")


# -- dispatch -------------------------------------------------------------------------------

def job_dispatch(*, job_id: int) -> None:
    from kiln.fleet.services import job_dispatch_device_tasks

    job = _load_active_job(job_id, "dispatch")
    if job is None:
        return
    job_stage_start(job=job, stage="dispatch")
    job_dispatch_device_tasks(job=job)


# -- collect: another search round, or the report ------------------------------------------

MAX_SEARCH_ROUNDS = 4
SEARCH_BUDGET_SECONDS = 3600


def _measured_by_target(job) -> dict[str, list[dict]]:
    from kiln.reports.services import device_reports

    reports, _ = device_reports(job=job)
    return {report.target: report.variants for report in reports}


def _next_round_specs(job) -> list[dict]:
    round_number = job.search.get("round", 1)
    if job.precisions != [specs.AUTO] or round_number >= MAX_SEARCH_ROUNDS:
        return []
    if time.time() - job.search.get("started_at", time.time()) > SEARCH_BUDGET_SECONDS:
        job_event_add(job=job, stage="devices", level="warning", message="The search's time budget is spent; reporting the best found.")
        return []
    proposals: dict[str, dict] = {}
    for entries in _measured_by_target(job).values():
        for spec in _search_specs(job, round_number=round_number + 1, measured=entries):
            proposals.setdefault(spec["key"], spec)
    existing = set(job.variants.values_list("key", flat=True))
    return [spec for spec in proposals.values() if spec["key"] not in existing]


def job_collect(*, job_id: int) -> None:
    """After the devices: plan the search's next round, or go on to the report."""
    from workers import tasks

    job = DeploymentJob.objects.select_related("model_version", "calibration_dataset__blob", "converted_blob").filter(pk=job_id).first()
    if job is None or job.is_terminal or job.stage != "report":
        return
    next_specs = _next_round_specs(job)
    if not next_specs:
        enqueue_stage(job_id=job_id, stage="report")
        return
    round_number = job.search.get("round", 1) + 1
    job.search["round"] = round_number
    job.save(update_fields=["search", "updated_at"])
    created = _create_variants(job, next_specs, round_number=round_number)
    job_stage_start(job=job, stage="quantize")
    job_event_add(job=job, stage="quantize", message=f"Search round {round_number}: {len(created)} refined candidate(s): {', '.join(created)}.")
    for variant_id in job.variants.filter(round=round_number, status=VariantStatus.PENDING).values_list("id", flat=True):
        transaction.on_commit(lambda vid=variant_id: tasks.variant_build.delay(vid))


# -- report ---------------------------------------------------------------------------------

def _report(job) -> str:
    from kiln.reports.services import report_build

    return report_build(job=job)


def job_report(*, job_id: int) -> None:
    from .services import job_succeed

    if run_stage(job_id, "report", _report):
        job = DeploymentJob.objects.get(pk=job_id)
        if not job.is_terminal:
            job_succeed(job=job, message="Report ready.")
