"""Blobs (content-addressed files), models, model versions and datasets."""
from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from kiln.accounts.models import Organization


class Blob(models.Model):
    """One stored file; identical bytes share one file on disk (keyed by sha256)."""

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="blobs")
    sha256 = models.CharField(max_length=64)
    size_bytes = models.BigIntegerField()
    storage_key = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["organization", "sha256"], name="one_blob_per_org_and_digest")]


class Model(models.Model):
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="models")
    name = models.CharField(max_length=200)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]


class SourceFormat(models.TextChoices):
    ONNX = "onnx"
    ONNX_ZIP = "onnx-zip"
    TORCH_EXPORT = "torch-export"
    TORCHSCRIPT = "torchscript"


# Formats converted to ONNX at upload: the ONNX lives with the extracted files, the upload stays the version's blob.
CONVERTED_FORMATS = (SourceFormat.TORCH_EXPORT, SourceFormat.TORCHSCRIPT)


class ModelVersion(models.Model):
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="model_versions")
    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    blob = models.ForeignKey(Blob, on_delete=models.PROTECT, related_name="+")
    source_format = models.CharField(max_length=16, choices=SourceFormat.choices)
    filename = models.CharField(max_length=255)
    onnx_member = models.CharField(max_length=255, blank=True, default="")
    signature = models.JSONField(default=dict)
    opset = models.IntegerField(null=True)
    op_histogram = models.JSONField(default=dict)
    parameter_count = models.BigIntegerField(default=0)
    validation = models.JSONField(default=dict)
    # Per output: the kind inferred from the graph ({"kind", "reason", ...}) and the user's override.
    output_kinds = models.JSONField(default=dict, blank=True)
    output_kind_overrides = models.JSONField(default=dict, blank=True)
    # PyTorch uploads: the exporter used (and why the first one failed), the PyTorch graph's ops and
    # parameters, and the parity of the ONNX export with the PyTorch model.
    conversion = models.JSONField(default=dict, blank=True)
    # PyTorch uploads: the ONNX export the pipeline works on (the upload itself stays `blob`).
    onnx_blob = models.ForeignKey(Blob, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    # What each runtime says about the model's operators (devices/support.py), the server's and each agent's, newest
    # per (where, backend, runtime version): {"answers": [{...answer, "where", "at", "sha256"}]}.
    operator_support = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["number"]
        constraints = [models.UniqueConstraint(fields=["model", "number"], name="one_number_per_model")]


class DatasetKind(models.TextChoices):
    CALIBRATION = "calibration"
    VALIDATION = "validation"


class Dataset(models.Model):
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="datasets")
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=DatasetKind.choices)
    blob = models.ForeignKey(Blob, on_delete=models.PROTECT, related_name="+")
    samples = models.IntegerField()
    arrays = models.JSONField(default=dict)
    has_labels = models.BooleanField(default=False)
    # "npz" (named arrays, row i = sample i) or "samples" (a zip of one .npz per sample).
    format = models.CharField(max_length=16, default="npz")
    # Raw data (images, audio, text) becomes `blob` through this declared recipe; `source_blob` keeps
    # the raw upload and `previews` the first samples as the UI shows them.
    recipe = models.JSONField(default=dict, blank=True)
    source_blob = models.ForeignKey(Blob, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    previews = models.JSONField(default=list, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]


class Upload(models.Model):
    """A resumable upload in flight (tus): bytes land in a part file until the last chunk makes it a blob."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="uploads")
    # "user:<id>" or "agent:<id>": only who started an upload may add to it or use it.
    owner = models.CharField(max_length=40)
    filename = models.CharField(max_length=255)
    length = models.BigIntegerField()
    offset = models.BigIntegerField(default=0)
    expected_sha256 = models.CharField(max_length=64, blank=True, default="")
    blob = models.ForeignKey(Blob, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]

    @property
    def complete(self) -> bool:
        return self.blob_id is not None
