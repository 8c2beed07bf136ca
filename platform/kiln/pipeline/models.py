"""Deployment jobs and their state: events, artifacts, variants and device tasks."""
from __future__ import annotations

from django.conf import settings
from django.db import models

from kiln.accounts.models import Organization
from kiln.registry.models import Blob, Dataset, ModelVersion

STAGES = ("validate", "convert", "support", "reference", "quantize", "dispatch", "devices", "report")


class JobStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING_FOR_DEVICES = "waiting_for_devices"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"


TERMINAL_JOB_STATUSES = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED}


class DeploymentJob(models.Model):
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="jobs")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    model_version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="jobs")
    precisions = models.JSONField(default=list)
    calibration_dataset = models.ForeignKey(Dataset, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    validation_dataset = models.ForeignKey(Dataset, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    targets = models.JSONField(default=list)
    tolerance = models.JSONField(default=dict)
    # Metrics the job declared per output, and the evaluation plan the agents follow (set once the
    # FP32 reference exists: kinds per output, primaries, options).
    metrics = models.JSONField(default=list, blank=True)
    evaluation = models.JSONField(default=dict, blank=True)
    # How the datasets are fed (kiln_contract/feeds.py): {"state": {output: input}, "initial_state": {...},
    # "calibration": plan, "validation": plan, "calibration_subset": {...}}.
    feeds = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=24, choices=JobStatus.choices, default=JobStatus.QUEUED, db_index=True)
    stage = models.CharField(max_length=16, default="validate")
    progress = models.FloatField(default=0.0)
    stages = models.JSONField(default=list)
    error = models.TextField(blank=True, default="")
    converted_blob = models.ForeignKey(Blob, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    validation_blob = models.ForeignKey(Blob, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    reference_blob = models.ForeignKey(Blob, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    # The `auto` search: current round, sensitivity ranking, when the search started.
    search = models.JSONField(default=dict, blank=True)
    # Operator support, asked of each runtime before anything is built (kiln.pipeline.support): {"answers": [...],
    # "skipped": {backend: reason}}; a skipped backend gets no variant and no device task.
    support = models.JSONField(default=dict, blank=True)
    # A re-run repeats another job's inputs; its report says what differed.
    rerun_of = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="reruns")
    # Deployment package options: {"encrypt": bool, "preprocessing": {...}, "postprocessing": {...}}.
    package = models.JSONField(default=dict, blank=True)
    # Versions of the host-side toolchain when the job was created; devices report their own.
    toolchain = models.JSONField(default=dict, blank=True)
    # The work lease of the host-side stage task sent last (kiln.pipeline.leases): offered when it
    # is enqueued, claimed and kept alive by the worker running it; the reaper re-sends it when it
    # expires (the worker died, or the message was lost).
    stage_task = models.CharField(max_length=16, blank=True, default="")
    stage_lease_owner = models.CharField(max_length=32, blank=True, default="")
    stage_lease_expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    stage_attempts = models.PositiveIntegerField(default=0)
    # When the stage task was first sent (a re-send keeps it): its place in its class's queue (kiln.pipeline.waiting).
    stage_offered_at = models.DateTimeField(null=True, blank=True)
    # Seconds of work the job has had (its builds and stages running, its device tasks measuring; never time spent
    # waiting): what an `auto` search's budget counts (kiln.pipeline.selectors.search_seconds_left). Added to with F().
    work_seconds = models.FloatField(default=0.0)
    # Why the job waits, where only a worker can tell (a build paused for a timing window, a slot or memory it waits
    # for): {"cause", "message", "since"}; the rest of the picture is read from the queues (kiln.pipeline.waiting).
    waiting = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_JOB_STATUSES


class JobEvent(models.Model):
    job = models.ForeignKey(DeploymentJob, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(auto_now_add=True)
    stage = models.CharField(max_length=16)
    level = models.CharField(max_length=8, default="info")
    message = models.TextField()

    class Meta:
        ordering = ["at", "id"]


class ArtifactKind(models.TextChoices):
    CONVERTED = "converted"
    SOURCE = "source"  # the PyTorch file a job's ONNX was exported from
    REFERENCE = "reference"
    VARIANT = "variant"
    COMPILED = "compiled"
    PACKAGE = "package"


class Artifact(models.Model):
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="artifacts")
    job = models.ForeignKey(DeploymentJob, on_delete=models.CASCADE, related_name="artifacts")
    kind = models.CharField(max_length=16, choices=ArtifactKind.choices)
    name = models.CharField(max_length=255)
    precision = models.CharField(max_length=32, blank=True, default="")
    backend = models.CharField(max_length=32, blank=True, default="")
    blob = models.ForeignKey(Blob, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["job", "kind", "name"], name="one_artifact_per_job_kind_name")]


class VariantStatus(models.TextChoices):
    PENDING = "pending"
    BUILDING = "building"
    READY = "ready"
    SKIPPED = "skipped"
    FAILED = "failed"


class Variant(models.Model):
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="variants")
    job = models.ForeignKey(DeploymentJob, on_delete=models.CASCADE, related_name="variants")
    key = models.CharField(max_length=120)
    precision = models.CharField(max_length=32)
    options = models.JSONField(default=dict)
    round = models.PositiveIntegerField(default=1)
    cache_key = models.CharField(max_length=128, blank=True, default="", db_index=True)
    recipe = models.JSONField(default=dict)
    backends = models.JSONField(default=list)
    status = models.CharField(max_length=16, choices=VariantStatus.choices, default=VariantStatus.PENDING)
    error = models.TextField(blank=True, default="")
    artifact = models.ForeignKey(Artifact, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # The build's work lease, as the job's stage lease above.
    build_lease_owner = models.CharField(max_length=32, blank=True, default="")
    build_lease_expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    build_attempts = models.PositiveIntegerField(default=0)
    build_offered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["job", "key"], name="one_variant_per_job_key")]


class DeviceTaskStatus(models.TextChoices):
    QUEUED = "queued"
    LEASED = "leased"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"


class DeviceTaskPurpose(models.TextChoices):
    MEASURE = "measure"
    RETIME = "retime"


TERMINAL_TASK_STATUSES = {DeviceTaskStatus.SUCCEEDED, DeviceTaskStatus.FAILED, DeviceTaskStatus.CANCELED}


class DeviceTask(models.Model):
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="device_tasks")
    job = models.ForeignKey(DeploymentJob, on_delete=models.CASCADE, related_name="device_tasks")
    variant = models.ForeignKey(Variant, on_delete=models.CASCADE, related_name="device_tasks")
    backend = models.CharField(max_length=32)
    target = models.CharField(max_length=200)
    pinned_agent = models.ForeignKey("fleet.Agent", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    required_labels = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=DeviceTaskStatus.choices, default=DeviceTaskStatus.QUEUED, db_index=True)
    attempt = models.PositiveIntegerField(default=0)
    leased_by = models.ForeignKey("fleet.Agent", null=True, blank=True, on_delete=models.SET_NULL, related_name="leased_tasks")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # The lease or the last progress report of the attempt: a running agent's heartbeats extend its lease only within
    # KILN_AGENT_SILENT_STAGE_SECONDS of it (kiln.fleet.services.device_task_lease_extend), so a hung stage lets go.
    reported_at = models.DateTimeField(null=True, blank=True)
    stage = models.CharField(max_length=32, blank=True, default="")
    message = models.TextField(blank=True, default="")
    progress = models.FloatField(default=0.0)
    metrics = models.JSONField(default=dict)
    accuracy = models.JSONField(default=dict)
    profile = models.JSONField(default=dict)
    log = models.TextField(blank=True, default="")
    error = models.TextField(blank=True, default="")
    compiled_artifact = models.ForeignKey(Artifact, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # MEASURE: one variant compiled, benchmarked and evaluated. RETIME: the near-tie variants of one
    # device (`retime["tasks"]`, measure tasks of this job and target) timed again side by side in
    # interleaved windows on the agent that measured them (kiln.pipeline.retime).
    purpose = models.CharField(max_length=8, choices=DeviceTaskPurpose.choices, default=DeviceTaskPurpose.MEASURE)
    retime = models.JSONField(default=dict, blank=True)
    # The agent's own runtime's operator-support answer for this variant (devices/support.py), asked before compiling.
    support = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["job", "variant", "backend", "target", "purpose"], name="one_task_per_cell"),
        ]


class WorkSlot(models.Model):
    """One piece of host-side work of a class (build, check) running for an organization: the per-organization and
    per-host limits count these (kiln.pipeline.capacity). Renewed while the work runs; an expired one (its process
    died) no longer counts."""

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    job = models.ForeignKey(DeploymentJob, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    work_class = models.CharField(max_length=8)
    holder = models.CharField(max_length=200)
    host = models.CharField(max_length=255)
    expires_at = models.DateTimeField(db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["work_class", "organization"])]
