from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from kiln.core.fields import id_field
from kiln.reports.outcome import job_outcome

from ..models import Artifact, DeploymentJob, DeviceTask, JobEvent, Variant
from ..selectors import search_budget, variant_effective_precision
from ..waiting import job_waiting


class JobEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["at", "stage", "level", "message"]


class VariantSerializer(serializers.ModelSerializer):
    size_bytes = serializers.SerializerMethodField()
    sha256 = serializers.SerializerMethodField()
    effective_precision = serializers.SerializerMethodField()

    class Meta:
        model = Variant
        fields = ["id", "key", "precision", "effective_precision", "round", "options", "backends", "recipe", "status", "error", "size_bytes",
                  "sha256"]

    def get_effective_precision(self, variant) -> str:
        """What the variant computes in: `precision` is how its weights are stored (a bf16 variant is an FP32 build)."""
        return variant_effective_precision(variant)

    def get_size_bytes(self, variant) -> int | None:
        return variant.artifact.blob.size_bytes if variant.artifact else None

    def get_sha256(self, variant) -> str | None:
        return variant.artifact.blob.sha256 if variant.artifact else None


class DeviceTaskSerializer(serializers.ModelSerializer):
    agent = serializers.SerializerMethodField()

    class Meta:
        model = DeviceTask
        fields = ["id", "variant", "backend", "target", "purpose", "agent", "status", "attempt", "stage", "message", "progress", "error", "started_at",
                  "finished_at", "support"]

    def get_agent(self, task) -> dict | None:
        # A task pinned to one device names it before any agent has leased it (not "agent:1").
        agent = task.leased_by or task.pinned_agent
        return {"id": agent.id, "name": agent.name} if agent else None


class WaitingSerializer(serializers.Serializer):
    """Why a job waits now (kiln.pipeline.waiting): absent (null) while it works or once it ended."""

    cause = serializers.ChoiceField(choices=["builds_paused", "memory", "organization_limit", "build_slot", "check_slot", "worker",
                                             "device_busy"])
    position = serializers.IntegerField(allow_null=True, help_text="How many jobs or device tasks are ahead, where known.")
    since = serializers.CharField(allow_null=True, help_text="When the wait began (ISO 8601).")
    message = serializers.CharField(help_text='In words: "waiting for a build slot: 2 jobs ahead (5 builds)".')


class JobListSerializer(serializers.ModelSerializer):
    model = serializers.SerializerMethodField()
    outcome = serializers.SerializerMethodField()
    budget = serializers.SerializerMethodField()
    waiting = serializers.SerializerMethodField()

    class Meta:
        model = DeploymentJob
        fields = [
            "id", "status", "stage", "progress", "error", "model_version", "model", "precisions", "targets", "tolerance", "metrics",
            "calibration_dataset", "validation_dataset", "created_at", "finished_at", "rerun_of", "package", "toolchain", "feeds", "budget",
            "outcome", "waiting",
        ]

    def get_outcome(self, job) -> list[dict]:
        return job_outcome(job=job)

    def get_budget(self, job) -> dict:
        """The search's time budget: minutes, seconds left while it runs, and why it stopped if the budget ended it."""
        return search_budget(job)

    @extend_schema_field(WaitingSerializer(allow_null=True))
    def get_waiting(self, job) -> dict | None:
        return job_waiting(job)

    def get_model(self, job) -> dict:
        version = job.model_version
        # The weights' digest: two uploads of the same bytes are one model to compare, whatever their names.
        return {"id": version.model_id, "name": version.model.name, "version": version.number, "sha256": version.blob.sha256}


class JobSerializer(JobListSerializer):
    events = JobEventSerializer(many=True, read_only=True)
    variants = VariantSerializer(many=True, read_only=True)
    device_tasks = DeviceTaskSerializer(many=True, read_only=True)

    class Meta(JobListSerializer.Meta):
        fields = JobListSerializer.Meta.fields + ["evaluation", "stages", "events", "variants", "device_tasks", "support"]


class JobCreateSerializer(serializers.Serializer):
    model_version = id_field()
    precisions = serializers.JSONField(required=False, default=lambda: ["auto"])
    calibration_dataset = id_field(required=False, allow_null=True, default=None)
    validation_dataset = id_field(required=False, allow_null=True, default=None)
    targets = serializers.JSONField(required=False, default=list)
    tolerance = serializers.JSONField(required=False, default=dict)
    package = serializers.JSONField(required=False, default=dict)
    metrics = serializers.JSONField(required=False, default=list)
    state = serializers.JSONField(required=False, default=dict, help_text='Outputs that feed inputs on the next call, e.g. {"stateN": "state"}.')
    initial_state = serializers.JSONField(required=False, default=dict, help_text="First value of each state input: a number or a nested list (default 0).")
    calibration_subset = serializers.JSONField(required=False, default=None, allow_null=True,
                                               help_text='Calibrate on {"count": N, "seed": S, "stratify": true} samples (stratified by label when labels exist).')
    # Checked by the service (specs.parse_budget_minutes) so every caller gets the same message.
    budget_minutes = serializers.JSONField(required=False, default=None)


class ArtifactSerializer(serializers.ModelSerializer):
    sha256 = serializers.CharField(source="blob.sha256", read_only=True)
    size_bytes = serializers.IntegerField(source="blob.size_bytes", read_only=True)
    download_url = serializers.SerializerMethodField()

    class Meta:
        model = Artifact
        fields = ["id", "kind", "name", "precision", "backend", "sha256", "size_bytes", "download_url", "created_at"]

    def get_download_url(self, artifact) -> str:
        return reverse("artifact-download", args=[artifact.id])
