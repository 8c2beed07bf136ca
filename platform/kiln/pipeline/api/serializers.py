from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from kiln.core.fields import id_field
from kiln.core.schema import ANY_OBJECT, TARGET, OpenSerializer, json_field
from kiln.registry.api.serializers import RuntimeSupportSerializer
from kiln.reports.outcome import job_outcome

from ..models import Artifact, DeploymentJob, DeviceTask, JobEvent, Variant
from ..selectors import search_budget, variant_effective_precision
from ..waiting import job_waiting

# -- what a job declares (the request's JSON, as the job keeps it) --------------------------------------

class ToleranceSerializer(serializers.Serializer):
    """How much accuracy a variant may lose against FP32, as the job keeps it (kiln_contract/contract.py `parse_tolerance`)."""

    metric = serializers.CharField(required=False,
                                   help_text="auto, accuracy, cosine, sqnr, top1_agreement, mask_iou, relative_l2, … or a declared metric.")
    max_drop = serializers.FloatField(required=False, help_text="The allowed drop against FP32 (a fraction: 0.01 = one point).")
    min_value = serializers.FloatField(required=False, help_text="For sqnr: the lowest acceptable SQNR in dB.")


class ToleranceSpecSerializer(serializers.Serializer):
    """A tolerance as a request may say it: `max_drop` also takes text such as "1%"."""

    metric = serializers.CharField(required=False)
    max_drop = json_field({"oneOf": [{"type": "number"}, {"type": "string"}]}, required=False)
    min_value = serializers.FloatField(required=False)


class DeclaredMetricSerializer(OpenSerializer):
    """A metric declared for one output (kiln_contract/contract.py `parse_declared_metrics`)."""

    output = serializers.CharField()
    kind = serializers.CharField()
    primary = serializers.BooleanField(required=False)
    threshold = serializers.FloatField(required=False)
    match_iou = serializers.FloatField(required=False)
    nms_iou = serializers.FloatField(required=False)
    blank = serializers.IntegerField(required=False)
    plugin = serializers.CharField(required=False)


class CalibrationSubsetSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    seed = serializers.IntegerField(required=False)
    stratify = serializers.BooleanField(required=False)


class PackageOptionsSerializer(serializers.Serializer):
    encrypt = serializers.BooleanField(required=False)
    preprocessing = json_field(ANY_OBJECT, required=False)
    postprocessing = json_field(ANY_OBJECT, required=False)


class EvaluationOutputSerializer(OpenSerializer):
    name = serializers.CharField()
    kind = serializers.CharField()
    primary = serializers.BooleanField()
    reason = serializers.CharField(required=False)
    options = json_field(ANY_OBJECT, required=False)
    declared = DeclaredMetricSerializer(many=True, required=False)


class EvaluationPlanSerializer(OpenSerializer):
    """What every device measures per output, set once FP32's reference outputs exist ({} before)."""

    outputs = EvaluationOutputSerializer(many=True, required=False)
    labels = serializers.BooleanField(required=False)
    declared_primary = serializers.BooleanField(required=False)


# -- the job ---------------------------------------------------------------------------------------------

class JobEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["at", "stage", "level", "message"]
        read_only_fields = fields


class JobSupportSerializer(OpenSerializer):
    """The support stage: every runtime's answer on the model's operators, and the backends it skipped with the reason."""

    answers = RuntimeSupportSerializer(many=True, required=False)
    skipped = serializers.DictField(child=serializers.CharField(), required=False)


class JobStageSerializer(serializers.Serializer):
    name = serializers.CharField()
    status = serializers.ChoiceField(choices=["pending", "running", "done", "skipped", "failed", "canceled"])
    started_at = serializers.CharField(allow_null=True)
    finished_at = serializers.CharField(allow_null=True)
    message = serializers.CharField(allow_null=True, allow_blank=True)
    seconds = serializers.FloatField(required=False, help_text="Over every finished run of the stage (a search runs some once per round).")
    runs = serializers.IntegerField(required=False)


class NamedRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()


class ModelRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    version = serializers.IntegerField(help_text="The version's number.")
    sha256 = serializers.CharField(help_text="The weights' digest: two uploads of the same bytes are one model to compare.")


class JobOutcomeSerializer(serializers.Serializer):
    """Per device of a finished job: the recommended variant and its speed-up, read from the device's decision."""

    device = serializers.CharField(allow_null=True)
    agent = serializers.IntegerField(allow_null=True)
    recommended = serializers.CharField(allow_null=True, help_text="The decision's label.")
    precision = serializers.CharField(allow_null=True, help_text="What the recommended variant runs in (its effective precision).")
    speedup = serializers.FloatField(allow_null=True)
    comparison = serializers.ChoiceField(choices=["faster", "slower", "tie"], allow_null=True)
    provisional = serializers.BooleanField()
    speedup_text = serializers.CharField(allow_null=True, help_text='The decision\'s short cell ("2.41x faster", "1.04x (tie)").')
    beyond_noise = serializers.BooleanField(allow_null=True)
    tie = serializers.BooleanField()
    accuracy = json_field(ANY_OBJECT, allow_null=True)
    verdict = serializers.CharField(allow_null=True, allow_blank=True, help_text="The decision's text.")


class SearchBudgetSerializer(serializers.Serializer):
    """An `auto` job's time budget ({} for explicit precisions): it counts the job's own build and device time, not waiting."""

    minutes = serializers.FloatField(required=False)
    started_at = serializers.FloatField(allow_null=True, required=False)
    work_seconds = serializers.FloatField(required=False)
    seconds_left = serializers.FloatField(allow_null=True, required=False)
    first_answer_at = serializers.FloatField(allow_null=True, required=False)
    stopped = serializers.CharField(allow_null=True, required=False)


class VariantSerializer(serializers.ModelSerializer):
    options = json_field(ANY_OBJECT)
    recipe = json_field(ANY_OBJECT)
    backends = json_field({"type": "array", "items": {"type": "string"}})
    size_bytes = serializers.SerializerMethodField()
    sha256 = serializers.SerializerMethodField()
    effective_precision = serializers.SerializerMethodField()

    class Meta:
        model = Variant
        fields = ["id", "key", "precision", "effective_precision", "round", "options", "backends", "recipe", "status", "error", "size_bytes",
                  "sha256"]
        read_only_fields = fields

    def get_effective_precision(self, variant) -> str:
        """What the variant computes in: `precision` is how its weights are stored (a bf16 variant is an FP32 build)."""
        return variant_effective_precision(variant)

    def get_size_bytes(self, variant) -> int | None:
        return variant.artifact.blob.size_bytes if variant.artifact else None

    def get_sha256(self, variant) -> str | None:
        return variant.artifact.blob.sha256 if variant.artifact else None


class DeviceTaskSerializer(serializers.ModelSerializer):
    agent = serializers.SerializerMethodField()
    support = json_field({"oneOf": [{"$ref": "#/components/schemas/RuntimeSupport"}, {"type": "object", "maxProperties": 0}]},
                         help_text="The runtime's answer on the variant's operators; {} before it answered.")

    class Meta:
        model = DeviceTask
        fields = ["id", "variant", "backend", "target", "purpose", "agent", "status", "attempt", "stage", "message", "progress", "error", "started_at",
                  "finished_at", "support"]
        read_only_fields = fields

    @extend_schema_field(NamedRefSerializer(allow_null=True))
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
    precisions = json_field({"type": "array", "items": {"type": "string"}})
    targets = json_field({"type": "array", "items": TARGET})
    tolerance = json_field(ToleranceSerializer)
    metrics = json_field(DeclaredMetricSerializer(many=True))
    package = json_field(PackageOptionsSerializer)
    toolchain = json_field(ANY_OBJECT, help_text='The host-side versions when the job was created: {"host": {...}}.')
    feeds = json_field(ANY_OBJECT, help_text="How the job's data is fed (devices/feeds.py), and which calibration samples it used.")

    class Meta:
        model = DeploymentJob
        fields = [
            "id", "status", "stage", "progress", "error", "model_version", "model", "precisions", "targets", "tolerance", "metrics",
            "calibration_dataset", "validation_dataset", "created_at", "finished_at", "rerun_of", "package", "toolchain", "feeds", "budget",
            "outcome", "waiting",
        ]
        read_only_fields = fields

    @extend_schema_field(JobOutcomeSerializer(many=True))
    def get_outcome(self, job) -> list[dict]:
        return job_outcome(job=job)

    @extend_schema_field(SearchBudgetSerializer)
    def get_budget(self, job) -> dict:
        """The search's time budget: minutes, seconds left while it runs, and why it stopped if the budget ended it."""
        return search_budget(job)

    @extend_schema_field(WaitingSerializer(allow_null=True))
    def get_waiting(self, job) -> dict | None:
        return job_waiting(job)

    @extend_schema_field(ModelRefSerializer)
    def get_model(self, job) -> dict:
        version = job.model_version
        # The weights' digest: two uploads of the same bytes are one model to compare, whatever their names.
        return {"id": version.model_id, "name": version.model.name, "version": version.number, "sha256": version.blob.sha256}


class JobSerializer(JobListSerializer):
    events = JobEventSerializer(many=True, read_only=True)
    variants = VariantSerializer(many=True, read_only=True)
    device_tasks = DeviceTaskSerializer(many=True, read_only=True)
    evaluation = json_field(EvaluationPlanSerializer)
    stages = json_field(JobStageSerializer(many=True))
    support = json_field(JobSupportSerializer)

    class Meta(JobListSerializer.Meta):
        fields = JobListSerializer.Meta.fields + ["evaluation", "stages", "events", "variants", "device_tasks", "support"]
        read_only_fields = fields


def _request_json(shape, **kwargs) -> serializers.JSONField:
    # The services parse these (kiln.pipeline.specs) so that every caller gets the same message; the schema says their shape.
    return json_field(shape, required=False, **kwargs)


class JobCreateSerializer(serializers.Serializer):
    model_version = id_field()
    precisions = _request_json({"type": "array", "items": {"type": "string"}}, default=lambda: ["auto"],
                               help_text='["auto"] (the search), or an explicit list: fp32, bf16, fp16, int8, int8-dynamic, int4-weight.')
    calibration_dataset = id_field(required=False, allow_null=True, default=None)
    validation_dataset = id_field(required=False, allow_null=True, default=None)
    targets = _request_json({"type": "array", "items": TARGET}, default=list,
                            help_text='Agent ids or "label=value" selectors; empty: every online agent.')
    tolerance = _request_json(ToleranceSpecSerializer, default=dict)
    package = _request_json(PackageOptionsSerializer, default=dict)
    metrics = _request_json(DeclaredMetricSerializer(many=True), default=list)
    state = _request_json({"type": "object", "additionalProperties": {"type": "string"}}, default=dict,
                          help_text='Outputs that feed inputs on the next call, e.g. {"stateN": "state"}.')
    initial_state = _request_json(ANY_OBJECT, default=dict, help_text="First value of each state input: a number or a nested list (default 0).")
    calibration_subset = _request_json(CalibrationSubsetSerializer(allow_null=True), default=None, allow_null=True,
                                       help_text='Calibrate on {"count": N, "seed": S, "stratify": true} samples (stratified by label when labels exist).')
    budget_minutes = _request_json({"type": "number", "nullable": True}, default=None, help_text="The `auto` search's time budget.")


class ArtifactSerializer(serializers.ModelSerializer):
    sha256 = serializers.CharField(source="blob.sha256", read_only=True)
    size_bytes = serializers.IntegerField(source="blob.size_bytes", read_only=True)
    download_url = serializers.SerializerMethodField()

    class Meta:
        model = Artifact
        fields = ["id", "kind", "name", "precision", "backend", "sha256", "size_bytes", "download_url", "created_at"]
        read_only_fields = fields

    def get_download_url(self, artifact) -> str:
        return reverse("artifact-download", args=[artifact.id])
