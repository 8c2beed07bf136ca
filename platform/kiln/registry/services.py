"""Writes for the registry: store uploads as blobs, create models, versions and datasets."""
from __future__ import annotations

import logging
import math
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Max, Q
from django.utils import timezone

from kiln.accounts.models import Organization
from kiln.core.errors import Conflict, KilnError, redact_server_paths, upload_too_large
from kiln.pipeline.capacity import LimitReached, slot_held
from kiln.pipeline.models import DeploymentJob
from kiln_contract.contract import OUTPUT_KINDS
from kiln_contract.recipes import RecipeError, parse_recipe
from workers import host_memory
from workers.archive import UnsafeArchive, UnsupportedArchive, extract_model_archive
from workers.celery import app as celery_app
from workers.dataset_commands import HDF5_SAMPLES, RAW_PREPARED
from workers.inspect import NESTING_LIMIT
from workers.pytorch.sandbox import SandboxFailed, Unconfined, run_in_sandbox
from workers.pytorch.scan import RefusedTorchFile, scan_torch_file
from workers.routing import CHECK
from workers.sandbox.runner import run_confined
from workers.support import check_isolated

from . import storage, uploads
from .messages import unreadable_model_message
from .models import CONVERTED_FORMATS, Blob, Dataset, DatasetKind, Model, ModelVersion, SourceFormat, Upload
from .selectors import model_version_onnx_path, organization_storage

logger = logging.getLogger(__name__)

MODEL_SUFFIXES = {".onnx": SourceFormat.ONNX, ".zip": SourceFormat.ONNX_ZIP, ".pt2": SourceFormat.TORCH_EXPORT, ".pt": SourceFormat.TORCHSCRIPT}
CONVERTED_ONNX_MEMBER = "model.onnx"


def blob_create(*, organization, path: Path, sha256: str | None = None, move: bool = False) -> Blob:
    """Store a file as a content-addressed blob of this organization (idempotent).

    Runs in a transaction holding the digest's lock, so a release of the same bytes cannot remove
    the file between the store and the row (the caller's transaction keeps the lock until it ends).
    """
    if sha256 is None:
        sha256, size = storage.file_sha256(path)
    else:
        size = Path(path).stat().st_size
    with transaction.atomic():
        _lock_digest(sha256)
        key = storage.put_file(Path(path), sha256=sha256, move=move)
        blob, _ = Blob.objects.get_or_create(
            organization=organization, sha256=sha256, defaults={"size_bytes": size, "storage_key": key},
        )
    return blob


def blob_create_staged(*, organization, key: str, sha256: str, size_bytes: int) -> Blob:
    """A blob of an object uploaded straight to storage through a presigned URL, once its bytes check out."""
    with transaction.atomic():
        _lock_digest(sha256)
        try:
            storage_key = storage.incoming_commit(key, sha256=sha256, size_bytes=size_bytes, max_bytes=settings.MAX_UPLOAD_BYTES)
        except storage.IncomingRejected as exc:
            raise KilnError(f"The upload was refused: {exc}.", code="staged_upload_rejected") from None
        blob, _ = Blob.objects.get_or_create(
            organization=organization, sha256=sha256, defaults={"size_bytes": size_bytes, "storage_key": storage_key},
        )
    return blob


def _lock_digest(sha256: str) -> None:
    """Serialize, until the current transaction ends, every store and release of one digest's file.

    PostgreSQL: a transaction-scoped advisory lock keyed by the digest. SQLite (the embedded
    default) needs none: every transaction takes the database's write lock when it begins
    (settings: transaction_mode IMMEDIATE).
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [int(sha256[:15], 16)])


def _source_format(filename: str) -> str:
    suffix = Path(filename or "").suffix.lower()
    if suffix not in MODEL_SUFFIXES:
        raise KilnError(
            f"Unsupported file type {suffix or '(none)'}: upload an .onnx file, a .zip holding one .onnx with its external data, "
            "a torch.export archive (.pt2) or a traced TorchScript file (.pt).",
            code="unsupported_format",
        )
    return MODEL_SUFFIXES[suffix]


def _input_elements(spec: dict) -> int:
    """Elements of one sample of an input: its fixed dimensions (symbolic ones count as 1)."""
    return math.prod(dim for dim in (spec.get("shape") or []) if isinstance(dim, int) and dim > 0)


def _check_input_sizes(signature: dict) -> None:
    """Refuse inputs so large that the first stage feeding them would exhaust the worker."""
    limit = settings.MAX_INPUT_ELEMENTS
    for spec in signature.get("inputs", []):
        elements = _input_elements(spec)
        if elements > limit:
            raise KilnError(
                f"Input {spec['name']!r} declares {elements:,} elements per sample (shape {spec.get('shape')}); "
                f"this server accepts at most {limit:,} (KILN_MAX_INPUT_ELEMENTS).",
                code="input_too_large",
            )


def _model_problem(onnx_path: Path, filename: str, detail: str) -> str:
    """What the user uploaded instead of an ONNX model, and how to make one (see registry/messages.py)."""
    if NESTING_LIMIT in detail:  # an ONNX model, but one the parser will not descend into: not a broken download
        return f"{Path(filename).name or 'The file'}: {detail}. Flatten its control flow (fewer nested If/Loop) and export it again."
    parse_failed = "not a readable ONNX model" in detail or "parsing" in detail.lower() or "parse" in detail.lower()
    return unreadable_model_message(path=Path(onnx_path), filename=Path(filename).name or "The file", parse_failed=parse_failed,
                                    detail=detail)


def _inspect_upload(*, upload_path: Path, source_format: str, sha256: str, filename: str) -> tuple[dict, str]:
    """Validate and inspect an uploaded model; returns (facts, onnx member name). Raises 400s."""
    onnx_path = upload_path
    member = ""
    staging = None
    # Messages name the user's file and its entries, never the server's folders.
    names = {upload_path: filename}
    if source_format in CONVERTED_FORMATS:
        staging = storage.new_temp_dir("torch-")
        names[staging] = ""
        onnx_path, conversion = _convert_torch_upload(upload_path, staging, filename=filename)
        member = CONVERTED_ONNX_MEMBER
    elif source_format == SourceFormat.ONNX_ZIP:
        staging = storage.new_temp_dir("extract-")
        names[staging] = ""
        try:
            onnx_path = extract_model_archive(
                upload_path,
                staging,
                max_total_bytes=settings.MAX_ARCHIVE_UNCOMPRESSED_BYTES,
                max_ratio=settings.MAX_ARCHIVE_RATIO,
            )
        except (UnsafeArchive, UnsupportedArchive) as exc:
            shutil.rmtree(staging, ignore_errors=True)
            code = "unsafe_archive" if isinstance(exc, UnsafeArchive) else "unsupported_format"
            raise KilnError(redact_server_paths(str(exc), names), code=code) from exc
        member = str(Path(onnx_path).relative_to(staging))
    else:
        names[Path(upload_path).name] = filename
    try:
        inspected = _inspect_confined(onnx_path, shared=staging or onnx_path)
        validation = inspected["validation"]
        if not validation["ok"]:
            raise KilnError(_model_problem(onnx_path, filename, redact_server_paths(validation["error"], names)), code="invalid_model")
        facts = inspected["facts"]
        facts["validation"] = validation
        _check_input_sizes(facts["signature"])
        facts["output_kinds"] = inspected["output_kinds"]
        if source_format in CONVERTED_FORMATS:
            facts["conversion"] = conversion
    except KilnError:
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    except Exception as exc:  # the inspector raises on unreadable protobufs
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
        raise KilnError(_model_problem(onnx_path, filename, redact_server_paths(str(exc), names)), code="invalid_model") from exc
    if staging and source_format in CONVERTED_FORMATS:
        # The export becomes a blob of its own with the version (_create_version), so every host finds it.
        facts["converted_onnx"] = str(onnx_path)
    elif staging:
        target = storage.extracted_dir(sha256)
        if target.exists():
            shutil.rmtree(staging, ignore_errors=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(staging), target)
    return facts, member


def _convert_torch_upload(upload_path: Path, staging: Path, *, filename: str) -> tuple[Path, dict]:
    """Check a PyTorch upload statically, then export it to ONNX in the sandbox; raises 400s with the reason."""
    try:
        facts = scan_torch_file(upload_path, max_total_bytes=settings.MAX_ARCHIVE_UNCOMPRESSED_BYTES)
    except RefusedTorchFile as refused:
        shutil.rmtree(staging, ignore_errors=True)
        raise KilnError(f"{filename}: {refused}", code=refused.code) from None
    onnx_path = staging / CONVERTED_ONNX_MEMBER
    try:
        conversion = run_in_sandbox({"command": "convert", "kind": facts.kind, "onnx_out": str(onnx_path)}, files={"model": upload_path},
                                    memory_mb=settings.TORCH_SANDBOX_MEMORY_MB, cpu_seconds=settings.TORCH_SANDBOX_CPU_SECONDS)
    except Unconfined as refused:
        shutil.rmtree(staging, ignore_errors=True)
        raise KilnError(f"{filename} was not loaded: {refused}", code="sandbox_unavailable", status_code=503) from None
    except SandboxFailed as failed:
        shutil.rmtree(staging, ignore_errors=True)
        raise KilnError(f"{filename} could not be loaded and exported to ONNX: {failed}", code=failed.code or "conversion_failed") from None
    parity = conversion["parity"]
    if not parity["passed"]:
        shutil.rmtree(staging, ignore_errors=True)
        worst = min(parity["outputs"], key=lambda output: output["cosine"])
        raise KilnError(
            f"{filename}: the ONNX export disagrees with the PyTorch model (output {worst['name']!r}: cosine {worst['cosine']:.6f}, "
            f"max abs error {worst['max_abs_error']}); the threshold is cosine >= {parity['threshold']}.",
            code="conversion_mismatch",
        )
    conversion["format"] = facts.kind
    conversion["pickle_globals"] = facts.globals
    return onnx_path, conversion


def _create_version(*, model: Model, upload, source_format: str, facts: dict, member: str) -> ModelVersion:
    blob = blob_create(organization=model.organization, path=Path(upload.temporary_file_path()), sha256=upload.sha256)
    onnx_blob = blob_create(organization=model.organization, path=Path(facts["converted_onnx"])) if facts.get("converted_onnx") else None
    number = (model.versions.aggregate(n=Max("number"))["n"] or 0) + 1
    return ModelVersion.objects.create(
        organization=model.organization,
        model=model,
        number=number,
        blob=blob,
        source_format=source_format,
        filename=Path(upload.name).name[:255],
        onnx_member=member,
        signature=facts["signature"],
        opset=facts.get("opset"),
        op_histogram=facts.get("op_histogram", {}),
        parameter_count=facts.get("parameter_count", 0),
        validation=facts["validation"],
        output_kinds=facts.get("output_kinds", {}),
        conversion=facts.get("conversion", {}),
        onnx_blob=onnx_blob,
    )


MAX_SUPPORT_ANSWERS = 32
SUPPORT_TASK_NAME = "kiln.model.operator_support"


def model_version_support_record(*, version: ModelVersion, answers: list[dict], where: str, sha256: str) -> None:
    """Keep the newest operator-support answer per (where, backend, runtime version) on the version, for its model page.

    `where` is "server" for the server's runtimes, else the agent's name; `sha256` names the ONNX file that was asked about.
    """
    now = timezone.now().isoformat()
    with transaction.atomic():
        locked = ModelVersion.objects.select_for_update().filter(pk=version.pk).first()
        if locked is None:
            return
        kept = {(a.get("where"), a.get("backend"), a.get("version")): a for a in (locked.operator_support or {}).get("answers", [])}
        for answer in answers:
            kept[(where, answer.get("backend"), answer.get("version"))] = {**answer, "where": where, "at": now, "sha256": sha256}
        newest = sorted(kept.values(), key=lambda a: a.get("at") or "", reverse=True)[:MAX_SUPPORT_ANSWERS]
        locked.operator_support = {"answers": newest}
        locked.save(update_fields=["operator_support"])


def model_version_check_support(*, version_id: int) -> None:
    """Ask the server's runtimes which of a new version's operators they run (the model page shows the answers)."""
    version = ModelVersion.objects.select_related("blob", "onnx_blob").filter(pk=version_id).first()
    if version is None:
        return
    onnx_path = model_version_onnx_path(version)
    folder = onnx_path.parent if version.source_format == SourceFormat.ONNX_ZIP else None
    # On a worker nobody waits on this answer: it runs in the background, so a hostile upload's check slows no one's job.
    # Run inline (Celery eager: the upload's request waits for it) it keeps its share, or a busy host would stall the request.
    answers = check_isolated(onnx_path, folder=folder, background=not settings.CELERY_TASK_ALWAYS_EAGER)
    model_version_support_record(version=version, answers=answers, where="server", sha256=(version.onnx_blob or version.blob).sha256)


def _enqueue_support_check(version: ModelVersion) -> None:
    version_id = version.id
    transaction.on_commit(lambda: celery_app.signature(SUPPORT_TASK_NAME, args=[version_id]).delay())


UPLOAD_MEMORY_WAIT_S = 30.0


@contextmanager
def upload_check_slot(*, organization_id: int, what: str) -> Iterator[None]:
    """Hold one of the organization's sandboxed-check slots while an upload is read (kiln.pipeline.capacity); over the
    per-organization or per-host limit, a 429 that names it (nothing is kept; the user sends it again later)."""
    # Read inside its HTTP request: it waits for the host's memory briefly, then runs (its sandbox still has its limits).
    short_wait = host_memory.MAX_WAIT_S.set(UPLOAD_MEMORY_WAIT_S)
    try:
        with slot_held(organization_id=organization_id, work_class=CHECK, holder=what):
            yield
    except LimitReached as reached:
        raise KilnError(f"{what[:1].upper()}{what[1:]} was not read: {reached.refused.message}. Send it again then.",
                        code="limit_reached", status_code=429, details={"limit": reached.refused.limit, "running": reached.refused.running,
                                                                         "scope": reached.refused.scope}) from None
    finally:
        host_memory.MAX_WAIT_S.reset(short_wait)


def model_create(*, organization, user, name: str, upload) -> Model:
    """Create a model and its version 1 from an uploaded file; nothing is kept on bad input."""
    with upload_check_slot(organization_id=organization.id, what=f"the upload of {Path(upload.name).name}"):
        return _model_create(organization=organization, user=user, name=name, upload=upload)


def _model_create(*, organization, user, name: str, upload) -> Model:
    name = (name or "").strip() or Path(upload.name).stem
    source_format = _source_format(upload.name)
    facts, member = _inspect_upload(upload_path=Path(upload.temporary_file_path()), source_format=source_format, sha256=upload.sha256, filename=Path(upload.name).name)
    source_format = facts.get("conversion", {}).get("format", source_format)
    try:
        with transaction.atomic():
            model = Model.objects.create(organization=organization, name=name[:200], created_by=user)
            _enqueue_support_check(_create_version(model=model, upload=upload, source_format=source_format, facts=facts, member=member))
    finally:
        _discard_staging(facts)
    return model


def model_version_create(*, model: Model, upload) -> ModelVersion:
    with upload_check_slot(organization_id=model.organization_id, what=f"the upload of {Path(upload.name).name}"):
        return _model_version_create(model=model, upload=upload)


def _model_version_create(*, model: Model, upload) -> ModelVersion:
    source_format = _source_format(upload.name)
    facts, member = _inspect_upload(upload_path=Path(upload.temporary_file_path()), source_format=source_format, sha256=upload.sha256, filename=Path(upload.name).name)
    source_format = facts.get("conversion", {}).get("format", source_format)
    try:
        with transaction.atomic():
            Model.objects.select_for_update().filter(pk=model.pk).first()
            version = _create_version(model=model, upload=upload, source_format=source_format, facts=facts, member=member)
            _enqueue_support_check(version)
            return version
    finally:
        _discard_staging(facts)


def _discard_staging(facts: dict) -> None:
    """The folder a PyTorch export was written to, once it is a blob (or the version was not made)."""
    if facts.get("converted_onnx"):
        shutil.rmtree(Path(facts["converted_onnx"]).parent, ignore_errors=True)


def _blob_referenced(blob: Blob) -> bool:
    """Whether any row still points at this blob, through any foreign key of any app."""
    relations = [field for field in Blob._meta.get_fields(include_hidden=True) if field.auto_created and not field.concrete]
    return any(relation.related_model._default_manager.filter(**{relation.field.name: blob}).exists() for relation in relations)


def blob_release(*, blob: Blob) -> bool:
    """Delete a blob row nothing references, and its file once no organization stores those bytes.

    Runs inside the caller's transaction, holding the digest's lock, so no upload of the same bytes
    can attach to the row while it goes. The file goes only after the transaction commits (a
    rollback never leaves a row without its file), under the lock again (see blob_file_release).
    """
    _lock_digest(blob.sha256)
    if not Blob.objects.filter(pk=blob.pk).exists() or _blob_referenced(blob):
        return False
    sha256 = blob.sha256
    blob.delete()
    transaction.on_commit(lambda: blob_file_release(sha256=sha256))
    return True


def blob_file_release(*, sha256: str) -> bool:
    """Remove a digest's stored file when no blob row of any organization names it any more."""
    with transaction.atomic():
        _lock_digest(sha256)
        if Blob.objects.filter(sha256=sha256).exists():
            return False
        storage.delete_file(sha256)
    return True


def model_delete(*, model: Model) -> None:
    """Delete a model, its versions, and the blobs nothing else references."""
    with transaction.atomic():
        Model.objects.select_for_update().filter(pk=model.pk).first()
        if DeploymentJob.objects.filter(model_version__model=model).exists():
            raise KilnError("This model has deployment jobs; it is kept so their reports stay valid.", code="in_use", status_code=409)
        blobs = [blob for version in model.versions.select_related("blob", "onnx_blob") for blob in (version.blob, version.onnx_blob) if blob]
        model.delete()
        for blob in blobs:
            blob_release(blob=blob)


def model_version_delete(*, version: ModelVersion) -> None:
    """Delete one version of a model and release its blob; the model keeps at least one version."""
    with transaction.atomic():
        Model.objects.select_for_update().filter(pk=version.model_id).first()
        if DeploymentJob.objects.filter(model_version=version).exists():
            raise KilnError("This version has deployment jobs; it is kept so their reports stay valid.", code="in_use", status_code=409)
        if not ModelVersion.objects.filter(model_id=version.model_id).exclude(pk=version.pk).exists():
            raise KilnError("This is the model's only version; delete the model instead.", code="last_version", status_code=409)
        blobs = [blob for blob in (version.blob, version.onnx_blob) if blob]
        version.delete()
        for blob in blobs:
            blob_release(blob=blob)


MAX_TOKENIZER_BYTES = 64 * 1024**2


def dataset_create(*, organization, user, name: str, kind: str, upload, recipe=None, tokenizer=None) -> Dataset:
    """A dataset from an `.npz` of arrays or a zip of per-sample `.npz` files, or from raw data
    (images, WAV files, lines of text) through a declared recipe."""
    with upload_check_slot(organization_id=organization.id, what=f"the upload of {Path(upload.name or 'data').name}"):
        return _dataset_create(organization=organization, user=user, name=name, kind=kind, upload=upload, recipe=recipe, tokenizer=tokenizer)


def _dataset_create(*, organization, user, name: str, kind: str, upload, recipe=None, tokenizer=None) -> Dataset:
    if kind not in DatasetKind.values:
        raise KilnError(f"kind must be one of {', '.join(DatasetKind.values)}.", code="invalid")
    if recipe not in (None, "", {}):
        return _raw_dataset_create(organization=organization, user=user, name=name, kind=kind, upload=upload, recipe=recipe, tokenizer=tokenizer)
    filename = Path(upload.name or "").name
    suffix = Path(filename).suffix.lower()
    if suffix in HDF5_SUFFIXES:
        return _hdf5_dataset_create(organization=organization, user=user, name=name, kind=kind, upload=upload)
    if suffix not in (".npz", ".zip"):
        raise KilnError("A dataset is an .npz file of named input arrays (first axis = samples), a .zip of one .npz per sample, "
                        "or an HDF5 file of one group per sample.", code="unsupported_format")
    upload_path = Path(upload.temporary_file_path())
    info = _parse_dataset_confined("dataset.inspect", upload_path, filename=filename)
    with transaction.atomic():
        blob = blob_create(organization=organization, path=Path(upload.temporary_file_path()), sha256=upload.sha256)
        return Dataset.objects.create(
            organization=organization,
            name=((name or "").strip() or Path(upload.name).stem)[:200],
            kind=kind,
            blob=blob,
            samples=info["samples"],
            arrays=info["arrays"],
            has_labels=info["has_labels"],
            format=info["format"],
            created_by=user,
        )


RAW_SUFFIXES = {"image": (".zip",), "audio": (".zip",), "text": (".txt",)}
HDF5_SUFFIXES = (".h5", ".hdf5")


def _hdf5_dataset_create(*, organization, user, name: str, kind: str, upload) -> Dataset:
    """An HDF5 file of one group per sample, kept as uploaded and stored as a zip of one .npz per sample."""
    filename = Path(upload.name or "").name
    upload_path = Path(upload.temporary_file_path())
    with tempfile.TemporaryDirectory(prefix="kiln-h5-") as scratch:
        samples = Path(scratch) / "samples.zip"
        info = _parse_dataset_confined("dataset.hdf5", upload_path, filename=filename, outputs={HDF5_SAMPLES: samples})
        with transaction.atomic():
            return Dataset.objects.create(
                organization=organization, name=((name or "").strip() or Path(filename).stem)[:200], kind=kind,
                blob=blob_create(organization=organization, path=samples),
                source_blob=blob_create(organization=organization, path=upload_path, sha256=upload.sha256),
                samples=info["samples"], arrays=info["arrays"], has_labels=info["has_labels"], format=info["format"], created_by=user,
            )


def _parse_dataset_confined(command: str, upload_path: Path, *, filename: str, outputs: dict | None = None, prefix: str = "",
                            **request) -> dict:
    """Run a dataset parser (workers/dataset_commands.py) in the sandbox on the upload; its failures are 400s."""
    try:
        return run_confined(command, {"path": str(upload_path), "display_name": filename, "max_bytes": settings.MAX_DATASET_BYTES, **request},
                            shared=(upload_path,), outputs=outputs, memory_mb=settings.TORCH_SANDBOX_MEMORY_MB,
                            cpu_seconds=settings.TORCH_SANDBOX_CPU_SECONDS)
    except Unconfined as refused:
        raise KilnError(f"{filename} was not read: {refused}", code="sandbox_unavailable", status_code=503) from None
    except SandboxFailed as failed:
        message = redact_server_paths(str(failed), {upload_path: filename, upload_path.name: filename})
        raise KilnError(f"{prefix}{message}" if failed.code else f"{filename} could not be read: {message}", code="invalid_dataset") from None


def _tokenizer_text(tokenizer) -> str | None:
    if tokenizer is None:
        return None
    if tokenizer.size > MAX_TOKENIZER_BYTES:
        raise KilnError(f"tokenizer.json is over {MAX_TOKENIZER_BYTES // 1024**2} MB.", code="invalid_recipe")
    try:
        return tokenizer.read().decode("utf-8")
    except UnicodeDecodeError:
        raise KilnError("tokenizer.json is not UTF-8 text.", code="invalid_recipe") from None


MAX_PREVIEW_BYTES = 64 * 1024**2


def dataset_preview(*, organization, upload, recipe, version=None, names: list[str] | None = None) -> dict:
    """What a recipe makes of a few files of a raw upload (one a class), and whether that fits the model's input; nothing
    is stored. `names` are every file the user chose, when the upload holds only those to preview."""
    with upload_check_slot(organization_id=organization.id, what=f"the preview of {Path(upload.name or 'data').name}"):
        return _dataset_preview(upload=upload, recipe=recipe, version=version, names=names)


def _dataset_preview(*, upload, recipe, version=None, names: list[str] | None = None) -> dict:
    try:
        parsed = parse_recipe(recipe)
    except RecipeError as exc:
        raise KilnError(f"The recipe is not valid: {exc}.", code="invalid_recipe") from None
    filename = Path(upload.name or "").name
    upload_path = Path(upload.temporary_file_path())
    if upload_path.stat().st_size > MAX_PREVIEW_BYTES:
        raise KilnError(f"A preview reads at most {MAX_PREVIEW_BYTES // 1024**2} MB; send the first few files only.", code="too_large", status_code=413)
    preview = _parse_dataset_confined("dataset.preview", upload_path, filename=filename, recipe=parsed, prefix=f"{filename}: ", names=names)
    return {**preview, "recipe": parsed, "fits": _preview_fits(preview["arrays"], version) if version is not None else None}


def _preview_fits(arrays: dict, version) -> dict:
    """Each prepared tensor against the model input it feeds: rank (without the batch axis), fixed sizes, dtype."""
    inputs = {tensor["name"]: tensor for tensor in (version.signature or {}).get("inputs", [])}
    problems = []
    for name, made in arrays.items():
        expected = inputs.get(name)
        if expected is None:
            problems.append(f"the model has no input named {name!r} (its inputs: {', '.join(inputs) or 'none'})")
            continue
        per_sample = list(expected.get("shape") or [])[1:]
        if len(per_sample) != len(made["shape"]):
            problems.append(f"{name}: the recipe makes {made['shape']} per sample, the model takes {per_sample} after the batch axis")
        else:
            wrong = [f"{got} where it needs {want}" for got, want in zip(made["shape"], per_sample, strict=True) if isinstance(want, int) and want > 0 and got != want]
            if wrong:
                problems.append(f"{name}: {', '.join(wrong)} (shape {made['shape']}, the model takes {per_sample})")
        if expected.get("dtype") and expected["dtype"] != made["dtype"]:
            problems.append(f"{name}: the recipe makes {made['dtype']}, the model takes {expected['dtype']}")
    return {"ok": not problems, "problems": problems}


def _raw_dataset_create(*, organization, user, name: str, kind: str, upload, recipe, tokenizer) -> Dataset:
    """Prepare every raw sample by the recipe before anything is stored: one bad sample refuses the whole upload."""
    try:
        parsed = parse_recipe(recipe)
    except RecipeError as exc:
        raise KilnError(f"The recipe is not valid: {exc}.", code="invalid_recipe") from None
    filename = Path(upload.name or "").name
    if Path(filename).suffix.lower() not in RAW_SUFFIXES[parsed["type"]]:
        wanted = " or ".join(RAW_SUFFIXES[parsed["type"]])
        raise KilnError(f"A {parsed['type']} recipe reads a {wanted} file, not {filename!r}.", code="unsupported_format")
    tokenizer_json = _tokenizer_text(tokenizer)
    upload_path = Path(upload.temporary_file_path())
    with tempfile.TemporaryDirectory(prefix="kiln-raw-") as scratch:
        prepared = Path(scratch) / "prepared.npz"
        info = _parse_dataset_confined("dataset.raw", upload_path, filename=filename, outputs={RAW_PREPARED: prepared},
                                       recipe=parsed, tokenizer_json=tokenizer_json, prefix=f"{filename}: ")
        with transaction.atomic():
            if tokenizer_json is not None:
                tokenizer_path = Path(scratch) / "tokenizer.json"
                tokenizer_path.write_text(tokenizer_json, encoding="utf-8")
                parsed["tokenizer_sha256"] = blob_create(organization=organization, path=tokenizer_path).sha256
            if info["label_names"]:
                parsed["label_names"] = info["label_names"]
            return Dataset.objects.create(
                organization=organization, name=((name or "").strip() or Path(filename).stem)[:200], kind=kind,
                blob=blob_create(organization=organization, path=prepared),
                source_blob=blob_create(organization=organization, path=upload_path, sha256=upload.sha256),
                samples=info["samples"], arrays=info["arrays"], has_labels=info["has_labels"], format=info["format"],
                recipe=parsed, previews=info["previews"], created_by=user,
            )


def dataset_delete(*, dataset: Dataset) -> None:
    """Delete a dataset and release its blob when nothing else references it."""
    with transaction.atomic():
        Dataset.objects.select_for_update().filter(pk=dataset.pk).first()
        if DeploymentJob.objects.filter(Q(calibration_dataset=dataset) | Q(validation_dataset=dataset)).exists():
            raise KilnError("This dataset is used by deployment jobs; it is kept so their results stay reproducible.", code="in_use", status_code=409)
        blobs = [dataset.blob, dataset.source_blob]
        tokenizer_sha256 = (dataset.recipe or {}).get("tokenizer_sha256")
        dataset.delete()
        # A tokenizer is referenced from recipes, not by a key: it goes when no recipe names it.
        if tokenizer_sha256 and not Dataset.objects.filter(organization=dataset.organization, recipe__tokenizer_sha256=tokenizer_sha256).exists():
            blobs.append(Blob.objects.filter(organization=dataset.organization, sha256=tokenizer_sha256).first())
        for blob in blobs:
            if blob is not None:
                blob_release(blob=blob)


# -- resumable uploads -----------------------------------------------------------------------

UPLOAD_LIFETIME = timedelta(hours=24)


def _size_text(count: int) -> str:
    for unit, size in (("GB", 1024**3), ("MB", 1024**2), ("KB", 1024)):
        if count >= size:
            return f"{count / size:,.1f} {unit}"
    return f"{count:,} bytes"


def storage_quota_check(*, organization, adding_bytes: int, what: str) -> None:
    """Refuse (413) storing `adding_bytes` more for the organization when that would pass its quota
    (KILN_STORAGE_QUOTA_BYTES); with 0 bytes, refuse once the organization is at its quota.

    The organization's row is locked until the caller's transaction ends (if it is in one), so two
    uploads starting at once cannot both take the last free bytes.
    """
    quota = settings.STORAGE_QUOTA_BYTES
    if not quota:
        return
    with transaction.atomic():
        Organization.objects.select_for_update().filter(pk=organization.pk).first()
        usage = organization_storage(organization=organization)
    used = usage["used_bytes"]
    if used < quota and used + adding_bytes <= quota:
        return
    needs = f"{what} needs {_size_text(adding_bytes)}, but the" if adding_bytes else "The"
    raise KilnError(
        f"{needs} organization uses {_size_text(used)} of its {_size_text(quota)} storage quota ({_size_text(usage['available_bytes'])} "
        "left). Delete models or datasets it no longer needs, or ask the operator to raise KILN_STORAGE_QUOTA_BYTES.",
        code="storage_quota_exceeded", status_code=413,
        details={"needed_bytes": adding_bytes, "used_bytes": used, "quota_bytes": quota, "available_bytes": usage["available_bytes"]},
    )


def upload_create(*, organization, owner: str, length: int, metadata: dict[str, str]) -> Upload:
    """Open a resumable upload of `length` bytes, reserved against the organization's storage quota."""
    if length < 0:
        raise KilnError("Upload-Length must be a byte count.", code="invalid_upload_length")
    if length > settings.MAX_UPLOAD_BYTES:
        raise upload_too_large()
    expected = (metadata.get("sha256") or "").lower()
    if expected and (len(expected) != 64 or any(c not in "0123456789abcdef" for c in expected)):
        raise KilnError("The sha256 metadata must be 64 hex digits.", code="invalid_metadata")
    with transaction.atomic():
        storage_quota_check(organization=organization, adding_bytes=length, what="This upload")
        return Upload.objects.create(
            organization=organization, owner=owner, length=length, expected_sha256=expected,
            filename=Path(metadata.get("filename") or "upload.bin").name[:255] or "upload.bin",
            expires_at=timezone.now() + UPLOAD_LIFETIME,
        )


def upload_append(*, upload: Upload, offset: int, stream, length: int) -> Upload:
    """Add one chunk at `offset`; the last byte verifies the whole digest and stores the blob."""
    if upload.complete:
        raise Conflict("This upload is already complete.", code="upload_complete")
    if offset != upload.offset:
        raise Conflict(f"Upload-Offset {offset} does not match the server's offset {upload.offset}.", code="offset_mismatch",
                       details={"offset": upload.offset})
    if length > upload.length - offset:
        raise KilnError("The chunk runs past the upload's declared length.", code="upload_too_long")
    if offset and uploads.part_bytes(upload.id) < offset:
        # The earlier chunks landed on another web host (its part file is in that host's data folder):
        # writing here would fill the gap with zeros and fail the digest after the last byte.
        raise KilnError(
            "This upload's earlier chunks were received by another Kiln server. Send every chunk of an upload to one server "
            "(load-balancer stickiness for /uploads/) or share KILN_DATA_DIR/tmp between the web hosts.",
            code="upload_on_another_server", status_code=421,
        )
    path = uploads.part_path(upload.id)
    try:
        written = uploads.append_chunk(path=path, offset=offset, stream=stream, length=length)
    except uploads.ChunkInterrupted as broken:
        Upload.objects.filter(pk=upload.pk, offset=offset).update(offset=offset + broken.written, updated_at=timezone.now())
        raise KilnError("The chunk broke off; ask for the offset (HEAD) and send the rest.", code="chunk_interrupted") from None
    if not Upload.objects.filter(pk=upload.pk, offset=offset).update(offset=offset + written, updated_at=timezone.now()):
        raise Conflict("Another request moved this upload's offset.", code="offset_mismatch")
    upload.refresh_from_db()
    if upload.offset == upload.length:
        _upload_finish(upload, path)
    return upload


def _upload_finish(upload: Upload, path: Path) -> None:
    sha256, size = storage.file_sha256(path)
    if upload.expected_sha256 and sha256 != upload.expected_sha256:
        path.unlink(missing_ok=True)
        upload.delete()
        raise KilnError(
            f"The assembled file's sha256 is {sha256}, not the {upload.expected_sha256} announced; the upload was discarded.",
            code="digest_mismatch",
        )
    with transaction.atomic():
        upload.blob = blob_create(organization=upload.organization, path=path, sha256=sha256, move=True)
        upload.save(update_fields=["blob", "updated_at"])


def upload_delete(*, upload: Upload) -> None:
    """Remove an upload, its part file, and the blob a finished one made unless something else uses those bytes."""
    part = uploads.part_path(upload.id)
    with transaction.atomic():
        blob = upload.blob
        upload.delete()
        if blob is not None:
            blob_release(blob=blob)
    part.unlink(missing_ok=True)


def uploads_expire() -> int:
    """Remove expired uploads of every organization (finished or not, never used), and part files no
    upload owns any more. Housekeeping on the beat schedule: idempotent, safe on several hosts."""
    removed = 0
    for upload in Upload.objects.filter(expires_at__lt=timezone.now()).select_related("blob")[:UPLOADS_EXPIRED_PER_RUN]:
        with transaction.atomic():
            # Another host may have removed it (or a user consumed it) since the list was read.
            current = Upload.objects.select_for_update(skip_locked=True).filter(pk=upload.pk, expires_at__lt=timezone.now()).first()
            if current is not None:
                upload_delete(upload=current)
                removed += 1
    _orphan_parts_remove()
    return removed


UPLOADS_EXPIRED_PER_RUN = 500


def _orphan_parts_remove() -> None:
    """Part files older than an upload lives whose row is gone (a process died between the two)."""
    folder = uploads.parts_dir()
    if not folder.is_dir():
        return
    cutoff = timezone.now().timestamp() - UPLOAD_LIFETIME.total_seconds()
    for part in folder.glob("*.part"):
        try:
            if part.stat().st_mtime < cutoff and not Upload.objects.filter(pk=part.stem).exists():
                part.unlink(missing_ok=True)
        except (OSError, ValueError, ValidationError):
            continue


def upload_consume(*, upload: Upload) -> uploads.StoredUpload:
    """Hand a finished upload to a service that makes a model, version, dataset or artifact of it (once)."""
    if not upload.complete:
        raise Conflict(f"The upload has {upload.offset} of {upload.length} bytes; finish it first.", code="upload_incomplete")
    stored = uploads.StoredUpload(name=upload.filename, path=storage.local_path(upload.blob.sha256), sha256=upload.blob.sha256, blob=upload.blob)
    upload.delete()
    return stored


@contextmanager
def upload_released_on_error(*, upload):
    """When what a finished upload was for is refused (an invalid model), its blob goes too: nothing is left behind."""
    try:
        yield
    except KilnError:
        blob = getattr(upload, "blob", None)
        if blob is not None:
            with transaction.atomic():
                blob_release(blob=blob)
        raise


def _inspect_confined(onnx_path: Path, *, shared: Path) -> dict:
    """The ONNX checker, the description and the output kinds, parsed in the sandbox (workers.inspect.inspect_upload)."""
    try:
        return run_confined("onnx.inspect", {"model": str(onnx_path)}, shared=(Path(shared),), memory_mb=settings.TORCH_SANDBOX_MEMORY_MB,
                            cpu_seconds=settings.TORCH_SANDBOX_CPU_SECONDS)
    except Unconfined as refused:
        raise KilnError(f"The model was not read: {refused}", code="sandbox_unavailable", status_code=503) from None
    except SandboxFailed as failed:
        return {"validation": {"ok": False, "error": str(failed)}}


def model_version_set_output_kinds(*, version: ModelVersion, overrides: dict) -> ModelVersion:
    """Override the inferred kind of some outputs (`{name: kind}`; null drops an override)."""
    if not isinstance(overrides, dict):
        raise KilnError('output_kinds must be an object like {"logits": "class_scores"}.', code="invalid_output_kinds")
    names = [output["name"] for output in (version.signature or {}).get("outputs", [])]
    merged = dict(version.output_kind_overrides or {})
    for name, kind in overrides.items():
        if name not in names:
            raise KilnError(f"The model has no output {name!r}; its outputs are {', '.join(names)}.", code="unknown_output")
        if kind is None:
            merged.pop(name, None)
        elif kind not in OUTPUT_KINDS:
            raise KilnError(f"Unknown output kind {kind!r} for {name!r}; use one of {', '.join(OUTPUT_KINDS)}.", code="invalid_output_kinds")
        else:
            merged[name] = kind
    version.output_kind_overrides = merged
    version.save(update_fields=["output_kind_overrides"])
    return version
