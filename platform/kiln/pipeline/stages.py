"""The host-side stages of a job around the quantize rounds, one function per Celery task.

validate -> convert -> support (support.py) -> reference -> (quantize rounds: see quantize.py) -> dispatch -> report.
Each can run twice safely.
"""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np
from django.conf import settings
from django.db import transaction

from kiln.registry.models import CONVERTED_FORMATS, SourceFormat
from kiln.registry.selectors import blob_file
from kiln.registry.services import blob_create
from kiln.reports.models import Report
from kiln.reports.packaging import build_device_package, package_name
from kiln.reports.selectors import DeviceReport, device_json, device_reports
from kiln.reports.services import device_estimate, measurements_record
from kiln_contract.contract import evaluation_plan
from workers.pytorch.sandbox import SandboxFailed, run_in_sandbox
from workers.reference import REFERENCE_FILE
from workers.sandbox.runner import model_shown, run_confined

from .device_tasks import job_dispatch_device_tasks
from .models import ArtifactKind, DeploymentJob
from .queue import enqueue_stage
from .runner import StageFailed, load_active_job, model_folder, run_stage, scratch_dir, source_model_path
from .services import artifact_store, job_event_add, job_stage_start, job_succeed

logger = logging.getLogger(__name__)

SYNTHETIC_SAMPLES = 16


# -- validate -------------------------------------------------------------------------------

def _validate(job) -> str:
    result = _confined(job, "onnx.validate", {"model": str(source_model_path(job))}, what="the ONNX checker")["validation"]
    if not result["ok"]:
        raise StageFailed(f"The ONNX checker rejected the model: {result['error']}")
    return "The ONNX checker accepted the model."


def job_validate(*, job_id: int) -> None:
    if run_stage(job_id, "validate", _validate):
        enqueue_stage(job_id=job_id, stage="convert")


# -- convert --------------------------------------------------------------------------------

PARITY_SAMPLES = 64


def _pytorch_parity(job) -> str:
    """Compare the PyTorch upload with its ONNX export on the job's own inputs, in the sandbox; fail the stage when they disagree."""
    version = job.model_version
    conversion = version.conversion or {}
    exporter = "torch.onnx.export(dynamo=True)" if conversion.get("exporter") == "dynamo" else "the TorchScript-based torch.onnx.export"
    fallback = f" (the dynamo exporter failed: {conversion['fallback_reason']})" if conversion.get("fallback_reason") else ""
    job_event_add(job=job, stage="convert", message=f"Exported from {version.filename} with {exporter}{fallback}.")
    artifact_store(job=job, kind=ArtifactKind.SOURCE, name=version.filename, path=blob_file(version.blob), precision="fp32")
    with scratch_dir() as scratch:
        inputs = _validation_inputs(job, scratch, stage="convert")
        try:
            result = run_in_sandbox({"command": "parity", "kind": version.source_format, "max_samples": PARITY_SAMPLES},
                                    files={"model": blob_file(version.blob), "onnx": source_model_path(job), "inputs": inputs},
                                    memory_mb=settings.TORCH_SANDBOX_MEMORY_MB, cpu_seconds=settings.TORCH_SANDBOX_CPU_SECONDS)
        except SandboxFailed as failed:
            raise StageFailed(f"The PyTorch model could not be compared with its ONNX export: {failed}") from None
    parity = result["parity"]
    for output in parity["outputs"]:
        job_event_add(job=job, stage="convert", message=f"Parity of {output['name']!r} on {parity['samples']} samples: "
                      f"cosine {output['cosine']:.7f}, max abs error {output['max_abs_error']:.3g}.")
    verdict = "passed" if parity["passed"] else "failed"
    summary = f"parity {verdict}: min cosine {parity['min_cosine']:.7f} (threshold {parity['threshold']})"
    if not parity["passed"]:
        raise StageFailed(f"The ONNX export does not match the PyTorch model on the job's inputs: {summary}.")
    return summary


def _confined(job, command: str, request: dict, *, what: str, shared: tuple[Path, ...] = (), outputs: dict | None = None) -> dict:
    """A stage's parse of the user's model (and data) in the sandbox (workers/sandbox): the source model is shown to it
    read-only with anything else in `shared`; a failure of the sandbox is the stage's failure, with its reason."""
    try:
        return run_confined(command, request, shared=(*model_shown(source_model_path(job), model_folder(job, source=True)), *shared),
                            outputs=outputs, memory_mb=settings.TORCH_SANDBOX_MEMORY_MB, cpu_seconds=settings.TORCH_SANDBOX_CPU_SECONDS,
                            what=what)
    except SandboxFailed as failed:
        raise StageFailed(f"{what[0].upper()}{what[1:]} could not run on the model: {failed}") from None


def _convert(job) -> str:
    parity = _pytorch_parity(job) + "; " if job.model_version.source_format in CONVERTED_FORMATS else ""
    return parity + _convert_onnx(job)


def _convert_onnx(job) -> str:
    if job.model_version.source_format == SourceFormat.ONNX_ZIP:
        job_event_add(job=job, stage="convert", level="warning", message="Models with external data are used as uploaded; conversion skipped.")
        return "skipped: external-data model"
    with scratch_dir() as scratch:
        out = scratch / "converted.onnx"
        report = _convert_confined(source_model_path(job), out)
        for step in report["steps"]:
            level = "info" if step["status"] == "applied" else "warning"
            reason = f": {step['reason']}" if step.get("reason") else ""
            job_event_add(job=job, stage="convert", level=level, message=f"{step['name']} {step['status']}{reason}")
        if report["written"] or not out.exists():
            job_event_add(job=job, stage="convert", level="warning", message="The converted model needs external data; the uploaded model is used instead.")
            return "kept the uploaded model"
        artifact = artifact_store(job=job, kind=ArtifactKind.CONVERTED, name="converted.onnx", path=out, precision="fp32")
    job.converted_blob = artifact.blob
    job.save(update_fields=["converted_blob", "updated_at"])
    applied = [s["name"] for s in report["steps"] if s["status"] == "applied"]
    return f"opset {report.get('opset')}; applied: {', '.join(applied) or 'nothing'}"


def _convert_confined(source: Path, out: Path) -> dict:
    """workers.convert.convert_model on the user's model, in the sandbox (the parsers and ONNX Runtime are native code)."""
    try:
        return run_confined("onnx.convert", {"model": str(source)}, shared=(source,), outputs={"converted/converted.onnx": out},
                            memory_mb=settings.TORCH_SANDBOX_MEMORY_MB, cpu_seconds=settings.TORCH_SANDBOX_CPU_SECONDS,
                            what="the conversion")
    except SandboxFailed as failed:
        raise StageFailed(f"The model could not be converted: {failed}") from None


def job_convert(*, job_id: int) -> None:
    if run_stage(job_id, "convert", _convert):
        enqueue_stage(job_id=job_id, stage="support")


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


def _validation_inputs(job, scratch: Path, *, stage: str = "reference") -> Path:
    if job.validation_dataset_id:
        return blob_file(job.validation_dataset.blob)
    if job.calibration_dataset_id:
        job_event_add(job=job, stage=stage, level="warning", message="No validation dataset: the calibration dataset is used to compare outputs with FP32.")
        return blob_file(job.calibration_dataset.blob)
    job_event_add(job=job, stage=stage, level="warning", message=f"No datasets: {SYNTHETIC_SAMPLES} seeded random inputs are used to compare outputs with FP32.")
    path = scratch / "synthetic-validation.npz"
    _synthetic_inputs(job.model_version.signature, path)
    return path


def validation_feed_plan(job) -> dict | None:
    """How the inputs the devices are measured on are fed (the validation set's plan, else the calibration set's)."""
    feeds = job.feeds or {}
    if job.validation_dataset_id:
        return feeds.get("validation")
    return feeds.get("calibration") if job.calibration_dataset_id else None


def _reference(job) -> str:
    plan = validation_feed_plan(job)
    with scratch_dir() as scratch:
        inputs = _validation_inputs(job, scratch)
        out = scratch / "reference.npz"
        computed = _confined(job, "reference.compute", {"model": str(source_model_path(job)), "inputs": str(inputs), "feeds": plan},
                             what="the FP32 reference run", shared=(Path(inputs),), outputs={REFERENCE_FILE: out})
        summary = computed["summary"]
        reference = artifact_store(job=job, kind=ArtifactKind.REFERENCE, name="reference-outputs.npz", path=out, precision="fp32")
        validation_blob = blob_create(organization=job.organization, path=inputs)
        job.evaluation = _evaluation_plan(job, list(summary["outputs"]), computed["output_kinds"])
        if plan:
            job.evaluation["feeds"] = plan
    job.reference_blob = reference.blob
    job.validation_blob = validation_blob
    job.save(update_fields=["reference_blob", "validation_blob", "evaluation", "updated_at"])
    kinds = ", ".join(f"{entry['name']}: {entry['kind']}{' (primary)' if entry['primary'] else ''}" for entry in job.evaluation["outputs"])
    job_event_add(job=job, stage="reference", message=f"Outputs judged as {kinds}.")
    calls = f" ({summary['calls']} calls)" if "calls" in summary else ""
    return f"FP32 reference outputs on {summary['samples']} samples{calls}."


def _options_words(declared: dict) -> str:
    return ", ".join(f"{key} {value}" for key, value in declared.items())


def _evaluation_plan(job, reference: list[str], kinds: dict) -> dict:
    """Kinds per output (the user's overrides, else `kinds`, inferred in the sandbox from the graph and FP32's values) and
    what each device measures; `reference` names the outputs the FP32 run wrote."""
    # The validation set's recipe may name the post-processing the user runs (kiln_contract.recipes.parse_output_kinds); the
    # user's own override on the model version still has the last word.
    recipe = (job.validation_dataset.recipe or {}) if job.validation_dataset_id else {}
    for name, declared in (recipe.get("outputs") or {}).items():
        if name in kinds:
            kinds[name] = {**declared, "reason": f"named by the validation set's recipe ({_options_words(declared)})", "source": "recipe"}
    for name, kind in (job.model_version.output_kind_overrides or {}).items():
        if name in kinds and kinds[name]["kind"] != kind:
            kinds[name] = {"kind": kind, "reason": "set by the user", "source": "override"}
    order = [output["name"] for output in job.model_version.signature.get("outputs", []) if output["name"] in reference] or reference
    has_labels = bool(job.validation_dataset_id and job.validation_dataset.has_labels)
    plan = evaluation_plan(output_kinds=kinds, output_order=order, declared=job.metrics or [], has_labels=has_labels)
    for entry in plan["outputs"]:
        entry["reason"] = kinds.get(entry["name"], {}).get("reason", "")
    return plan


def job_reference(*, job_id: int) -> None:
    if run_stage(job_id, "reference", _reference):
        enqueue_stage(job_id=job_id, stage="quantize")


# -- dispatch -------------------------------------------------------------------------------

def job_dispatch(*, job_id: int) -> None:
    job = load_active_job(job_id, "dispatch")
    if job is None:
        return
    job_stage_start(job=job, stage="dispatch")
    job_dispatch_device_tasks(job=job)


# -- report ---------------------------------------------------------------------------------

def _package_name(job: DeploymentJob, report: DeviceReport) -> str | None:
    """The file name of the device's package (model, version, variant, device); None when nothing was recommended."""
    chosen = next((v for v in report.variants if v["id"] == report.recommended), None)
    if chosen is None:
        return None
    return package_name(job=job, target=report.target, agent_name=report.agent.name if report.agent else None, chosen=chosen)


def _store_package(job: DeploymentJob, report: DeviceReport, name: str) -> None:
    """The recommended variant of one device, bundled for download with its report and a run script, as `name`."""
    device = device_json(agent=report.agent, target=report.target, variants=report.variants, recommended=report.recommended, reason=report.reason,
                         final=True, details=report.details)
    with tempfile.TemporaryDirectory(prefix="kiln-package-") as scratch:
        path = Path(scratch) / name
        if build_device_package(job=job, device=device, out_path=path):
            chosen = next(v for v in report.variants if v["id"] == report.recommended)
            # The package runs the chosen variant as it runs on the device: its effective precision (bf16 under OpenVINO's hint).
            artifact_store(job=job, kind=ArtifactKind.PACKAGE, name=name, path=path, precision=chosen.get("effective_precision") or chosen["precision"],
                           backend=chosen["backend"])


@transaction.atomic
def _report(job: DeploymentJob) -> str:
    """Store the final per-device reports and packages; fail the stage when nothing was measured."""
    reports, succeeded = device_reports(job=job)
    # The performance database keeps every measurement and compares it with the same variant's last one.
    for message in measurements_record(job=job, reports=reports):
        job_event_add(job=job, stage="report", level="warning", message=message)
    Report.objects.filter(job=job).delete()
    for report in reports:
        # The report keeps its package's name: the name says the model, which a later rename must not unlink.
        name = _package_name(job, report)
        Report.objects.create(
            organization=job.organization, job=job, target=report.target, agent=report.agent,
            recommended_task_id=report.recommended, reason=report.reason,
            data={"variants": report.variants, "estimate": device_estimate(job=job, report=report), "recommendation": report.details,
                  "package": name},
        )
        if name:
            _store_package(job, report, name)
    if not succeeded:
        raise StageFailed("No device task succeeded; the report lists each error.")
    return " | ".join(f"{r.agent.name if r.agent else r.target}: {r.reason}" for r in reports)


def job_report(*, job_id: int) -> None:
    if run_stage(job_id, "report", _report):
        job = DeploymentJob.objects.get(pk=job_id)
        if not job.is_terminal:
            job_succeed(job=job, message="Report ready.")
