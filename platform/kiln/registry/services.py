"""Writes for the registry: store uploads as blobs, create models, versions and datasets."""
from __future__ import annotations

import logging
import math
import shutil
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Max, Q
from django.utils import timezone

from devices.contract import OUTPUT_KINDS
from kiln.core.errors import Conflict, KilnError, redact_server_paths, upload_too_large
from kiln.pipeline.models import DeploymentJob
from workers.archive import UnsafeArchive, UnsupportedArchive, extract_model_archive
from workers.datasets import InvalidDataset, inspect_npz
from workers.inspect import infer_output_kinds, inspect_onnx, validate_onnx
from workers.pytorch.sandbox import SandboxFailed, run_in_sandbox
from workers.pytorch.scan import RefusedTorchFile, scan_torch_file

from . import storage, uploads
from .models import CONVERTED_FORMATS, Blob, Dataset, DatasetKind, Model, ModelVersion, SourceFormat, Upload

logger = logging.getLogger(__name__)

MODEL_SUFFIXES = {".onnx": SourceFormat.ONNX, ".zip": SourceFormat.ONNX_ZIP, ".pt2": SourceFormat.TORCH_EXPORT, ".pt": SourceFormat.TORCHSCRIPT}
CONVERTED_ONNX_MEMBER = "model.onnx"


def blob_create(*, organization, path: Path, sha256: str | None = None, move: bool = False) -> Blob:
    """Store a file as a content-addressed blob of this organization (idempotent)."""
    if sha256 is None:
        sha256, size = storage.file_sha256(path)
    else:
        size = Path(path).stat().st_size
    storage.put_file(Path(path), sha256=sha256, move=move)
    blob, _ = Blob.objects.get_or_create(
        organization=organization,
        sha256=sha256,
        defaults={"size_bytes": size, "storage_key": f"{sha256[:2]}/{sha256}"},
    )
    return blob


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
        validation = validate_onnx(onnx_path)
        if not validation["ok"]:
            raise KilnError(f"This is not a valid ONNX model: {redact_server_paths(validation['error'], names)}", code="invalid_model")
        facts = inspect_onnx(onnx_path)
        facts["validation"] = validation
        _check_input_sizes(facts["signature"])
        facts["output_kinds"] = _output_kinds(onnx_path)
        if source_format in CONVERTED_FORMATS:
            facts["conversion"] = conversion
    except KilnError:
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    except Exception as exc:  # the inspector raises on unreadable protobufs
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
        raise KilnError(f"This is not a valid ONNX model: {redact_server_paths(str(exc), names)}", code="invalid_model") from exc
    if staging:
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
    except SandboxFailed as failed:
        shutil.rmtree(staging, ignore_errors=True)
        raise KilnError(f"{filename} could not be loaded and exported to ONNX: {failed}", code="conversion_failed") from None
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
    )


def model_create(*, organization, user, name: str, upload) -> Model:
    """Create a model and its version 1 from an uploaded file; nothing is kept on bad input."""
    name = (name or "").strip() or Path(upload.name).stem
    source_format = _source_format(upload.name)
    facts, member = _inspect_upload(upload_path=Path(upload.temporary_file_path()), source_format=source_format, sha256=upload.sha256, filename=Path(upload.name).name)
    source_format = facts.get("conversion", {}).get("format", source_format)
    with transaction.atomic():
        model = Model.objects.create(organization=organization, name=name[:200], created_by=user)
        _create_version(model=model, upload=upload, source_format=source_format, facts=facts, member=member)
    return model


def model_version_create(*, model: Model, upload) -> ModelVersion:
    source_format = _source_format(upload.name)
    facts, member = _inspect_upload(upload_path=Path(upload.temporary_file_path()), source_format=source_format, sha256=upload.sha256, filename=Path(upload.name).name)
    source_format = facts.get("conversion", {}).get("format", source_format)
    with transaction.atomic():
        Model.objects.select_for_update().filter(pk=model.pk).first()
        return _create_version(model=model, upload=upload, source_format=source_format, facts=facts, member=member)


def _blob_referenced(blob: Blob) -> bool:
    """Whether any row still points at this blob, through any foreign key of any app."""
    relations = [field for field in Blob._meta.get_fields(include_hidden=True) if field.auto_created and not field.concrete]
    return any(relation.related_model._default_manager.filter(**{relation.field.name: blob}).exists() for relation in relations)


def blob_release(*, blob: Blob) -> bool:
    """Delete a blob row nothing references, and its file once no organization stores those bytes.

    Runs inside the caller's transaction; the files go only after it commits, so a rollback
    never leaves a row without its file.
    """
    if _blob_referenced(blob):
        return False
    sha256 = blob.sha256
    blob.delete()

    def remove_files() -> None:
        if not Blob.objects.filter(sha256=sha256).exists():
            storage.delete_file(sha256)

    transaction.on_commit(remove_files)
    return True


def model_delete(*, model: Model) -> None:
    if DeploymentJob.objects.filter(model_version__model=model).exists():
        raise KilnError("This model has deployment jobs; it is kept so their reports stay valid.", code="in_use", status_code=409)
    with transaction.atomic():
        blobs = [version.blob for version in model.versions.select_related("blob")]
        model.delete()
        for blob in blobs:
            blob_release(blob=blob)


def dataset_create(*, organization, user, name: str, kind: str, upload) -> Dataset:
    if kind not in DatasetKind.values:
        raise KilnError(f"kind must be one of {', '.join(DatasetKind.values)}.", code="invalid")
    filename = Path(upload.name or "").name
    if Path(filename).suffix.lower() != ".npz":
        raise KilnError("A dataset is an .npz file of named input arrays (first axis = samples).", code="unsupported_format")
    upload_path = Path(upload.temporary_file_path())
    try:
        info = inspect_npz(upload_path, display_name=filename, max_bytes=settings.MAX_DATASET_BYTES)
    except InvalidDataset as exc:
        raise KilnError(redact_server_paths(str(exc), {upload_path: filename, upload_path.name: filename}), code="invalid_dataset") from exc
    blob = blob_create(organization=organization, path=Path(upload.temporary_file_path()), sha256=upload.sha256)
    return Dataset.objects.create(
        organization=organization,
        name=((name or "").strip() or Path(upload.name).stem)[:200],
        kind=kind,
        blob=blob,
        samples=info["samples"],
        arrays=info["arrays"],
        has_labels=info["has_labels"],
        created_by=user,
    )


def dataset_delete(*, dataset: Dataset) -> None:
    if DeploymentJob.objects.filter(Q(calibration_dataset=dataset) | Q(validation_dataset=dataset)).exists():
        raise KilnError("This dataset is used by deployment jobs; it is kept so their results stay reproducible.", code="in_use", status_code=409)
    with transaction.atomic():
        blob = dataset.blob
        dataset.delete()
        blob_release(blob=blob)


# -- resumable uploads -----------------------------------------------------------------------

UPLOAD_LIFETIME = timedelta(hours=24)


def upload_create(*, organization, owner: str, length: int, metadata: dict[str, str]) -> Upload:
    """Open a resumable upload of `length` bytes; expired ones of the organization go first."""
    if length < 0:
        raise KilnError("Upload-Length must be a byte count.", code="invalid_upload_length")
    if length > settings.MAX_UPLOAD_BYTES:
        raise upload_too_large()
    expected = (metadata.get("sha256") or "").lower()
    if expected and (len(expected) != 64 or any(c not in "0123456789abcdef" for c in expected)):
        raise KilnError("The sha256 metadata must be 64 hex digits.", code="invalid_metadata")
    uploads_expire(organization=organization)
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
    upload.blob = blob_create(organization=upload.organization, path=path, sha256=sha256, move=True)
    upload.save(update_fields=["blob", "updated_at"])


def upload_delete(*, upload: Upload) -> None:
    uploads.part_path(upload.id).unlink(missing_ok=True)
    upload.delete()


def uploads_expire(*, organization) -> int:
    expired = list(Upload.objects.filter(organization=organization, expires_at__lt=timezone.now()))
    for upload in expired:
        upload_delete(upload=upload)
    return len(expired)


def upload_consume(*, upload: Upload) -> uploads.StoredUpload:
    """Hand a finished upload to a service that makes a model, version, dataset or artifact of it (once)."""
    if not upload.complete:
        raise Conflict(f"The upload has {upload.offset} of {upload.length} bytes; finish it first.", code="upload_incomplete")
    stored = uploads.StoredUpload(name=upload.filename, path=storage.blob_path(upload.blob.sha256), sha256=upload.blob.sha256, blob=upload.blob)
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


def _output_kinds(onnx_path: Path) -> dict:
    """Kinds inferred from the graph; a model the heuristics cannot read still uploads (the job infers again from values)."""
    try:
        return infer_output_kinds(onnx_path)
    except Exception as exc:
        logger.warning("output kinds of %s could not be inferred: %s", onnx_path.name, exc)
        return {}


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
