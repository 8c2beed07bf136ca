"""Per-device reports of a job: every measured variant, the Pareto set and the recommendation."""
from django.db import models

from kiln.accounts.models import Organization
from kiln.pipeline.models import DeploymentJob, DeviceTask


class Report(models.Model):
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="reports")
    job = models.ForeignKey(DeploymentJob, on_delete=models.CASCADE, related_name="reports")
    target = models.CharField(max_length=200)
    agent = models.ForeignKey("fleet.Agent", null=True, on_delete=models.SET_NULL, related_name="+")
    recommended_task = models.ForeignKey(DeviceTask, null=True, on_delete=models.SET_NULL, related_name="+")
    reason = models.TextField(blank=True, default="")
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["job", "target"], name="one_report_per_job_target")]


class Measurement(models.Model):
    """One variant measured on one device: a row of the performance database that outlives its job."""

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="measurements")
    job = models.ForeignKey(DeploymentJob, null=True, on_delete=models.SET_NULL, related_name="measurements")
    device_task = models.OneToOneField(DeviceTask, null=True, on_delete=models.SET_NULL, related_name="measurement")
    model = models.ForeignKey("registry.Model", null=True, on_delete=models.SET_NULL, related_name="+")
    model_version = models.ForeignKey("registry.ModelVersion", null=True, on_delete=models.SET_NULL, related_name="+")
    model_name = models.CharField(max_length=200)
    # The source model's sha256: the same bytes under another name are the same model.
    model_sha256 = models.CharField(max_length=64, db_index=True)
    op_histogram = models.JSONField(default=dict)
    # Work per operator type of the source model (workers.cost), for latency estimates.
    op_work = models.JSONField(default=dict)
    variant_key = models.CharField(max_length=120)
    variant_sha256 = models.CharField(max_length=64, blank=True, default="")
    precision = models.CharField(max_length=32)
    # What the device computed in (kiln_contract/labels.py): an FP32 build under OpenVINO's bf16 hint is bf16 here, not fp32.
    effective_precision = models.CharField(max_length=32, blank=True, default="", db_index=True)
    label = models.CharField(max_length=300, blank=True, default="")
    # Whether the job's decision recommended this variant on this device, and which measurement its p50 comes from.
    recommended = models.BooleanField(default=False)
    timing_source = models.CharField(max_length=32, blank=True, default="")
    recipe = models.JSONField(default=dict)
    backend = models.CharField(max_length=32)
    backend_version = models.CharField(max_length=64, blank=True, default="")
    compile_options = models.JSONField(default=dict)
    agent = models.ForeignKey("fleet.Agent", null=True, on_delete=models.SET_NULL, related_name="+")
    agent_name = models.CharField(max_length=120)
    # The machine: agent name and CPU model, so that a re-registered agent on it keeps its history.
    device_key = models.CharField(max_length=300, db_index=True, default="")
    agent_version = models.CharField(max_length=64, blank=True, default="")
    capabilities = models.JSONField(default=dict)
    latency_ms = models.JSONField(default=dict)
    p50_ms = models.FloatField()
    std_ms = models.FloatField(default=0.0)
    runs = models.IntegerField(default=0)
    throughput_per_s = models.FloatField(null=True)
    peak_memory_mb = models.FloatField(null=True)
    load_ms = models.FloatField(null=True)
    accuracy = models.JSONField(default=dict)
    profile_by_op_type = models.JSONField(default=list)
    # The earlier measurement of the same variant on the same device, and how this one compares.
    baseline = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    slowdown = models.FloatField(null=True)
    regression = models.BooleanField(default=False, db_index=True)
    measured_at = models.DateTimeField()

    class Meta:
        ordering = ["-measured_at", "-id"]
        indexes = [models.Index(fields=["organization", "model_sha256", "variant_key", "backend", "device_key"], name="measurement_series")]


class PackageKey(models.Model):
    """An organization's AES-256-GCM key for encrypted packages, stored wrapped by a key derived from the server's."""

    organization = models.OneToOneField(Organization, on_delete=models.CASCADE, related_name="package_key")
    key_id = models.CharField(max_length=32)
    wrapped_key = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
