"""Reads for the registry, always scoped to one organization."""
from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.db.models import Sum
from django.shortcuts import get_object_or_404
from django.utils import timezone

from . import storage
from .models import CONVERTED_FORMATS, Blob, Dataset, Model, ModelVersion, SourceFormat, Upload
from .recipes import propose_recipe


def model_list(*, organization, search: str = ""):
    queryset = Model.objects.filter(organization=organization).prefetch_related("versions__blob")
    if search:
        queryset = queryset.filter(name__icontains=search)
    return queryset


def model_get(*, organization, model_id: int) -> Model:
    return get_object_or_404(Model.objects.prefetch_related("versions__blob"), organization=organization, pk=model_id)


def model_versions_identical(*, version: ModelVersion) -> list[dict]:
    """Other versions of this organization with exactly the same bytes, oldest first: what an upload duplicates."""
    others = (ModelVersion.objects.filter(organization=version.organization, blob__sha256=version.blob.sha256)
              .exclude(pk=version.pk).select_related("model").order_by("id")[:5])
    return [{"model": other.model_id, "name": other.model.name, "version": other.number, "version_id": other.id} for other in others]


def model_version_get(*, organization, version_id: int) -> ModelVersion:
    return get_object_or_404(ModelVersion.objects.select_related("blob", "model"), organization=organization, pk=version_id)


def dataset_list(*, organization):
    return Dataset.objects.filter(organization=organization).select_related("blob", "source_blob")


def dataset_get(*, organization, dataset_id: int) -> Dataset:
    return get_object_or_404(Dataset.objects.select_related("blob", "source_blob"), organization=organization, pk=dataset_id)


def model_version_onnx_path(version: ModelVersion) -> Path:
    """The ONNX file of a version on this host (inside its extracted archive for zips, the export for PyTorch uploads)."""
    if version.source_format in CONVERTED_FORMATS:
        return storage.local_path(version.onnx_blob.sha256)
    if version.source_format == SourceFormat.ONNX_ZIP:
        return storage.extracted_model(version.blob.sha256) / version.onnx_member
    return storage.local_path(version.blob.sha256)


def blob_file(blob) -> Path:
    """A file on this host holding the blob's bytes (see storage.local_path)."""
    return storage.local_path(blob.sha256)


def upload_get(*, organization, owner: str, upload_id) -> Upload:
    """An upload of this organization started by this user or agent (anyone else: 404)."""
    return get_object_or_404(Upload.objects.select_related("blob", "organization"), organization=organization, owner=owner, pk=upload_id)


def organization_storage(*, organization) -> dict:
    """What an organization stores against its quota: its blobs (models, datasets, job artifacts; bytes
    shared with another organization count for each), plus unfinished uploads at their declared length."""
    stored = Blob.objects.filter(organization=organization).aggregate(total=Sum("size_bytes"))["total"] or 0
    in_flight = Upload.objects.filter(organization=organization, blob__isnull=True, expires_at__gt=timezone.now())
    reserved = in_flight.aggregate(total=Sum("length"))["total"] or 0
    quota = settings.STORAGE_QUOTA_BYTES or None
    used = stored + reserved
    return {"stored_bytes": stored, "uploads_in_flight_bytes": reserved, "used_bytes": used, "quota_bytes": quota,
            "available_bytes": max(0, quota - used) if quota else None}


def model_version_output_kinds(*, version: ModelVersion) -> dict:
    """Per output: the kind used (`kind`), what Kiln inferred and why, and whether the user overrode it."""
    inferred = version.output_kinds or {}
    overrides = version.output_kind_overrides or {}
    kinds = {}
    for output in (version.signature or {}).get("outputs", []):
        name = output["name"]
        guess = inferred.get(name) or {}
        kinds[name] = {
            "kind": overrides.get(name) or guess.get("kind"),
            "inferred": guess.get("kind"),
            "reason": guess.get("reason") or "not inferred yet: decided from FP32's outputs when a job runs",
            "overridden": name in overrides,
        }
    return kinds


def model_version_recipe(*, version: ModelVersion) -> dict:
    """The recipe Kiln proposes for raw data fed to this version, with the reason for each choice."""
    return propose_recipe(signature=version.signature or {}, output_kinds=model_version_output_kinds(version=version))
