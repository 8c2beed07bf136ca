from datetime import timedelta

from django.utils import timezone
from rest_framework import serializers

from kiln.core.fields import BoundedJSONField, TruncatedCharField, id_field
from kiln.core.schema import ANY_OBJECT, OpenSerializer, json_field
from kiln_contract import operator_support
from kiln_contract.paired import STOP_REASONS

from ..heartbeats import heartbeats_overlay
from ..models import Agent, RegistrationToken
from ..selectors import agent_current_task_id


class RegistrationTokenSerializer(serializers.ModelSerializer):
    prefix = serializers.SerializerMethodField()
    revoked = serializers.SerializerMethodField()
    expired = serializers.SerializerMethodField()
    agents = serializers.SerializerMethodField()

    class Meta:
        model = RegistrationToken
        fields = ["id", "name", "prefix", "created_at", "expires_at", "expired", "revoked", "agents"]
        read_only_fields = fields

    def get_expired(self, token) -> bool:
        return token.expired

    def get_prefix(self, token) -> str:
        return f"kiln_reg_{token.lookup_prefix}"

    def get_revoked(self, token) -> bool:
        return token.revoked_at is not None

    def get_agents(self, token) -> int:
        return token.agents.count()


MAX_TOKEN_DAYS = 3650


class RegistrationTokenCreateSerializer(serializers.Serializer):
    """A new registration token: a name, and when it stops enrolling (`expires_in_days` or `expires_at`; neither: never)."""

    name = serializers.CharField(max_length=120, required=False, default="agents")
    expires_in_days = serializers.IntegerField(required=False, allow_null=True, min_value=1, max_value=MAX_TOKEN_DAYS)
    expires_at = serializers.DateTimeField(required=False, allow_null=True)

    def validate(self, attrs):
        unknown = sorted(set(self.initial_data) - set(self.fields)) if isinstance(self.initial_data, dict) else []
        if unknown:  # a misspelt expiry must not make a token that never expires
            raise serializers.ValidationError(f"unknown field(s): {', '.join(unknown)} (a registration token takes name, "
                                              "expires_in_days or expires_at)")
        days, until = attrs.pop("expires_in_days", None), attrs.get("expires_at")
        if days is not None and until is not None:
            raise serializers.ValidationError("give expires_in_days or expires_at, not both")
        now = timezone.now()
        if days is not None:
            attrs["expires_at"] = now + timedelta(days=days)
        elif until is not None and not now < until <= now + timedelta(days=MAX_TOKEN_DAYS):
            raise serializers.ValidationError(f"expires_at must be in the future and at most {MAX_TOKEN_DAYS} days away")
        return attrs


# Bounds of what an agent may send: generous for real machines, small enough that a hostile or
# broken agent cannot store megabytes in a row that every `GET agents/` serves.
MAX_MS = 1e9
MAX_COUNT = 2**63 - 1
MAX_LABELS = 32
MAX_RUNTIMES = 16
MAX_ISA_FLAGS = 64
MAX_GPUS = 64
MAX_BATCH_ROWS = 32
MAX_PROFILE_ROWS = 500
MAX_LOG_CHARS = 64 * 1024
MAX_ERROR_CHARS = 8 * 1024


def _text(max_length: int = 200, **kwargs) -> serializers.CharField:
    return serializers.CharField(max_length=max_length, required=False, allow_null=True, allow_blank=True, **kwargs)


def _number(*, min_value: float = 0, max_value: float = MAX_MS) -> serializers.FloatField:
    return serializers.FloatField(min_value=min_value, max_value=max_value, required=False, allow_null=True)


def _count(*, max_value: int = MAX_COUNT) -> serializers.IntegerField:
    return serializers.IntegerField(min_value=0, max_value=max_value, required=False, allow_null=True)


class BoundedDictField(serializers.DictField):
    """A mapping with at most `max_items` keys of at most `max_key_length` characters."""

    def __init__(self, *, max_items: int, max_key_length: int = 64, **kwargs):
        self.max_items, self.max_key_length = max_items, max_key_length
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if isinstance(data, dict):
            if len(data) > self.max_items:
                raise serializers.ValidationError(f"At most {self.max_items} entries.")
            if any(len(str(key)) > self.max_key_length for key in data):
                raise serializers.ValidationError(f"Keys are at most {self.max_key_length} characters.")
        return super().to_internal_value(data)


class GpuDeviceSerializer(serializers.Serializer):
    name = _text()
    memory_mb = _count()
    driver_version = _text(64)


class GpuSerializer(serializers.Serializer):
    vendor = _text(64)
    count = _count(max_value=MAX_GPUS)
    name = _text()
    devices = serializers.ListField(child=GpuDeviceSerializer(), max_length=MAX_GPUS, required=False)


class CapabilitiesSerializer(serializers.Serializer):
    """What an agent's machine offers (devices/agent/capabilities.py); unknown keys are dropped."""

    os = _text(64)
    os_release = _text()
    arch = _text(64)
    cpu_model = _text()
    cores = _count(max_value=1_000_000)
    logical_cores = _count(max_value=1_000_000)
    isa = serializers.ListField(child=serializers.CharField(max_length=32), max_length=MAX_ISA_FLAGS, required=False)
    memory_mb = _count()
    gpu = GpuSerializer(required=False, allow_null=True)
    runtimes = BoundedDictField(child=serializers.CharField(max_length=64), max_items=MAX_RUNTIMES, required=False)
    agent_version = _text(64)
    python = _text(64)
    board = _text()
    # Set when a user-mode emulator runs the agent (devices/agent/arm.py): its timings are not the device's speed.
    emulated = _text(500)


class AgentCapabilitiesSerializer(OpenSerializer, CapabilitiesSerializer):
    """What an agent's machine offers, as it last said (an agent of an earlier release may have said more)."""


class AgentSerializer(serializers.ModelSerializer):
    online = serializers.BooleanField(read_only=True)
    revoked = serializers.SerializerMethodField()
    current_task = serializers.SerializerMethodField()
    labels = json_field({"type": "object", "additionalProperties": {"type": "string"}})
    capabilities = json_field(AgentCapabilitiesSerializer)

    class Meta:
        model = Agent
        fields = ["id", "name", "labels", "capabilities", "online", "last_heartbeat_at", "current_task", "revoked", "created_at"]
        read_only_fields = fields

    def to_representation(self, agent):
        # `online` and `last_heartbeat_at` with the heartbeats this process has not written yet.
        return super().to_representation(heartbeats_overlay([agent])[0])

    def get_revoked(self, agent) -> bool:
        return agent.revoked_at is not None

    def get_current_task(self, agent) -> int | None:
        return agent_current_task_id(agent)


class RegisterSerializer(serializers.Serializer):
    registration_token = serializers.CharField(max_length=200)
    name = serializers.CharField(max_length=120)
    labels = BoundedDictField(child=serializers.CharField(max_length=200), max_items=MAX_LABELS, required=False, default=dict)
    capabilities = CapabilitiesSerializer(required=False, default=dict)


class HeartbeatSerializer(serializers.Serializer):
    capabilities = CapabilitiesSerializer(required=False, default=dict)
    running_task = id_field(required=False, allow_null=True, default=None)


class LeaseSerializer(serializers.Serializer):
    wait_s = serializers.FloatField(required=False, default=0, min_value=0, max_value=300)


class ProgressSerializer(serializers.Serializer):
    attempt = serializers.IntegerField(min_value=1, max_value=1_000_000)
    stage = serializers.CharField(max_length=32, required=False, allow_blank=True, default="")
    message = TruncatedCharField(max_chars=2000, keep="head", required=False, allow_blank=True, default="")
    percent = serializers.FloatField(required=False, allow_null=True, default=None, min_value=0, max_value=100)


class LatencySerializer(serializers.Serializer):
    p50 = serializers.FloatField(min_value=0, max_value=MAX_MS)
    p90 = _number()
    p99 = _number()
    mean = _number()
    std = _number()
    cv = _number(max_value=1e6)
    min = _number()
    max = _number()
    count = _count()


class BatchRowSerializer(serializers.Serializer):
    batch_size = serializers.IntegerField(min_value=1, max_value=1 << 20)
    latency_ms = LatencySerializer()
    throughput_per_s = _number(max_value=1e12)
    runs = _count()
    unstable = serializers.BooleanField(required=False, allow_null=True)
    window_medians_ms = serializers.ListField(child=serializers.FloatField(min_value=0, max_value=MAX_MS), max_length=64, required=False)


class RetimeRowSerializer(serializers.Serializer):
    """One variant of a RETIME task: its measure task, its per-window medians in round order, and the summary of all its rounds'
    samples (devices/bench.py `side_by_side_row`; absent from agents of an earlier release)."""

    task = serializers.IntegerField(min_value=1)
    interleaved_medians_ms = serializers.ListField(child=serializers.FloatField(min_value=0, max_value=MAX_MS), min_length=1, max_length=64)
    latency_ms = LatencySerializer(required=False)
    throughput_per_s = _number(max_value=1e12)
    batch_size = _count(max_value=1 << 20)


class QuietWaitSerializer(serializers.Serializer):
    """How a RETIME task's wait for a quiet device went (devices/quiet.py `wait_until_quiet`)."""

    quiet = serializers.BooleanField()
    waited_s = serializers.FloatField(min_value=0, max_value=1e6)


class RuntimeCheckSerializer(serializers.Serializer):
    """The runtime self-check before timing (devices/crosscheck.py): what the outputs were compared with, on how many samples,
    each output's cosine, the lowest, and whether that is a runtime fault."""

    against = _text(64)
    samples = _count(max_value=1_000_000)
    cosine = BoundedDictField(child=serializers.FloatField(min_value=-1.0, max_value=1.0), max_items=64, max_key_length=200, required=False)
    min_cosine = _number(min_value=-1.0, max_value=1.0)
    fault = serializers.BooleanField(required=False, allow_null=True)


class MetricsSerializer(serializers.Serializer):
    """Speed of one task (devices/bench.py `run_benchmark`), or a RETIME task's rows; unknown keys are dropped."""

    retime = serializers.ListField(child=RetimeRowSerializer(), max_length=16, required=False)
    # Why a RETIME task's rounds stopped (kiln_contract/paired.py `stop_reason`).
    stopped = serializers.ChoiceField(choices=list(STOP_REASONS), required=False, allow_null=True)
    quiet_wait = QuietWaitSerializer(required=False)
    # The quiet windows the timing ran in (devices/quiet.py `Window.as_dict`): load before and after, re-takes.
    windows = serializers.ListField(child=BoundedJSONField(max_bytes=2048, max_depth=3), max_length=64, required=False)

    latency_ms = LatencySerializer(required=False)
    throughput_per_s = _number(max_value=1e12)
    batch_size = _count(max_value=1 << 20)
    runs = _count()
    unstable = serializers.BooleanField(required=False, allow_null=True)
    by_batch = serializers.ListField(child=BatchRowSerializer(), max_length=MAX_BATCH_ROWS, required=False)
    load_ms = _number()
    first_inference_ms = _number()
    peak_memory_mb = _number(max_value=1e9)
    threads = _count(max_value=1_000_000)
    size_bytes = _count()
    settings = BoundedJSONField(max_bytes=4096, max_depth=3, required=False)
    # The agent ran under a user-mode emulator: these are the emulator's timings (kept out of the performance database).
    emulated = _text(500)
    # The precision the runtime ran the float part in ("fp32", "bf16"), and the self-check before timing (kept with a failure too).
    float_precision = _text(16)
    runtime_check = RuntimeCheckSerializer(required=False)


class OpTypeRowSerializer(serializers.Serializer):
    op_type = serializers.CharField(max_length=200)
    time_ms = _number()
    share = _number(max_value=1.0 + 1e-6)
    count = _count()


class NodeRowSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=1000)
    op_type = serializers.CharField(max_length=200)
    time_ms = _number()
    share = _number(max_value=1.0 + 1e-6)
    # The model's own node names a runtime node runs (OpenVINO fuses and renames them).
    layers = serializers.ListField(child=serializers.CharField(max_length=1000), max_length=32, required=False)


class ProfileSerializer(serializers.Serializer):
    """Time per operator (devices/backends/base.py); unknown keys are dropped."""

    by_op_type = serializers.ListField(child=OpTypeRowSerializer(), max_length=MAX_PROFILE_ROWS, required=False)
    by_node = serializers.ListField(child=NodeRowSerializer(), max_length=MAX_PROFILE_ROWS, required=False)
    runs = _count()
    warmup_runs = _count()
    total_ms = _number()
    error = TruncatedCharField(max_chars=MAX_ERROR_CHARS, required=False, allow_blank=True, allow_null=True)


ACCURACY_NUMBERS = ("cosine", "sqnr_db", "max_abs_error", "top1_agreement", "top5_agreement", "accuracy", "reference_accuracy")


class AccuracySerializer(BoundedJSONField):
    """Accuracy against the FP32 reference (kiln_contract/metrics.py): a bounded object whose headline
    numbers, when present, are numbers."""

    def __init__(self, **kwargs):
        super().__init__(max_bytes=1024**2, max_depth=8, **kwargs)

    def to_internal_value(self, data):
        data = super().to_internal_value(data)
        for key in ACCURACY_NUMBERS:
            value = data.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise serializers.ValidationError({key: "Must be a number or null."})
        return data


class SupportAnswerSerializer(serializers.Serializer):
    """The agent's runtime on the variant's operators (kiln_contract/operator_support.py's shape), asked before it compiled; unknown keys are dropped."""

    backend = serializers.CharField(max_length=32)
    runtime = _text(64)
    version = _text(64)
    device = _text(64)
    source = _text(200)
    verdict = serializers.ChoiceField(choices=list(operator_support.VERDICTS))
    reason = TruncatedCharField(max_chars=operator_support.MAX_REASON_CHARS, required=False, allow_blank=True, allow_null=True)
    native = BoundedDictField(child=serializers.IntegerField(min_value=0, max_value=MAX_COUNT), max_items=MAX_PROFILE_ROWS, max_key_length=200, required=False)
    fallback = BoundedDictField(child=serializers.IntegerField(min_value=0, max_value=MAX_COUNT), max_items=MAX_PROFILE_ROWS, max_key_length=200, required=False)
    unsupported = BoundedDictField(child=serializers.IntegerField(min_value=0, max_value=MAX_COUNT), max_items=MAX_PROFILE_ROWS, max_key_length=200, required=False)
    nodes = BoundedJSONField(max_bytes=64 * 1024, max_depth=3, required=False)
    seconds = _number()


class ResultSerializer(serializers.Serializer):
    attempt = serializers.IntegerField(min_value=1, max_value=1_000_000)
    # handed_back: the agent is stopping before the task's long stages; queue it again.
    status = serializers.ChoiceField(choices=["succeeded", "failed", "handed_back"])
    error = TruncatedCharField(max_chars=MAX_ERROR_CHARS, required=False, allow_blank=True, allow_null=True, default="")
    metrics = MetricsSerializer(required=False, default=dict)
    accuracy = AccuracySerializer(required=False, default=dict, allow_null=True)
    profile = ProfileSerializer(required=False, default=dict, allow_null=True)
    log = TruncatedCharField(max_chars=MAX_LOG_CHARS, required=False, allow_blank=True, allow_null=True, default="", trim_whitespace=False)
    support = SupportAnswerSerializer(required=False, allow_null=True, default=None)


class ArtifactUploadSerializer(serializers.Serializer):
    """The compiled artifact: a multipart `file`, the id of the agent's finished resumable upload, or
    the `staged` token of an upload sent straight to S3 through the URL `artifact-upload` gave."""

    attempt = serializers.IntegerField(min_value=1, max_value=1_000_000)
    file = serializers.FileField(required=False)
    upload = serializers.UUIDField(required=False)
    staged = serializers.CharField(max_length=1000, required=False)
    filename = serializers.CharField(max_length=255, required=False)

    def validate(self, attrs):
        if sum(name in attrs for name in ("file", "upload", "staged")) != 1:
            raise serializers.ValidationError("Send one of: a file (multipart), the id of a finished upload, or a staged upload's token.")
        return attrs


class ArtifactUploadPlanSerializer(serializers.Serializer):
    """What an agent is about to upload, so that the server can sign a URL for exactly that."""

    attempt = serializers.IntegerField(min_value=1, max_value=1_000_000)
    sha256 = serializers.RegexField(r"^[0-9a-f]{64}$")
    size_bytes = serializers.IntegerField(min_value=0)
    filename = serializers.CharField(max_length=255, required=False, allow_blank=True, default="")



# -- answers (the agent protocol's are built as dicts and sent as they are: these state their shape, kiln.core.schema) ---------

class IntervalsSerializer(serializers.Serializer):
    """The intervals the server tells its agents (kiln.fleet.intervals), stretched as the online fleet grows."""

    heartbeat_interval_s = serializers.IntegerField()
    poll_interval_s = serializers.IntegerField()
    long_poll_s = serializers.IntegerField()
    lease_seconds = serializers.IntegerField()


class RegisteredSerializer(IntervalsSerializer):
    agent_id = serializers.IntegerField()
    agent_token = serializers.CharField(help_text="kiln_agt_…, shown once.")


class HeartbeatAnswerSerializer(IntervalsSerializer):
    cancel = serializers.ListField(child=serializers.IntegerField(), help_text="The tasks this agent must stop.")


class TaskFileSerializer(serializers.Serializer):
    url = serializers.CharField()
    sha256 = serializers.CharField()
    size_bytes = serializers.IntegerField()


class TaskFilesSerializer(serializers.Serializer):
    model = TaskFileSerializer(allow_null=True)
    validation = TaskFileSerializer(allow_null=True)
    reference = TaskFileSerializer(allow_null=True)


class TaskVariantSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    key = serializers.CharField()
    precision = serializers.CharField()
    recipe = json_field(ANY_OBJECT)


class TimingWindowSerializer(serializers.Serializer):
    warmup_runs = serializers.IntegerField()
    warmup_seconds = serializers.FloatField()
    min_runs = serializers.IntegerField()
    min_seconds = serializers.FloatField()


class BenchmarkSettingsSerializer(TimingWindowSerializer):
    """The benchmark protocol's settings (DESIGN.md section 6), the server's."""

    batch_sizes = serializers.ListField(child=serializers.IntegerField())


class RetimeVariantSerializer(serializers.Serializer):
    task = serializers.IntegerField()
    key = serializers.CharField()
    backend = serializers.CharField()
    compile = json_field(ANY_OBJECT)
    model = TaskFileSerializer(allow_null=True)


class RetimeOrderSerializer(serializers.Serializer):
    """For a RETIME task: the variants to time side by side, each with its model file, and the server's window settings."""

    rounds = serializers.IntegerField(help_text="The cap; the agent stops earlier once the leader separates (devices/paired.py).")
    min_rounds = serializers.IntegerField()
    window = TimingWindowSerializer(help_text="Each round's timing window (devices/bench.py INTERLEAVED_WINDOW).")
    wait_for_quiet_s = serializers.FloatField(help_text="Set when the last rounds were busy: wait this long for a quiet device first.")
    max_seconds = serializers.FloatField(allow_null=True, help_text="Set while another job's task waits for this device, or for "
                                         "an `auto` search, to what is left of its budget: stop the rounds after this many seconds, once "
                                         "`min_rounds` are done (why: \"time\").")
    variants = RetimeVariantSerializer(many=True)


class LeasedTaskSerializer(serializers.Serializer):
    """`POST tasks/lease` with a task: what to compile, time and evaluate, and where its files are."""

    id = serializers.IntegerField()
    attempt = serializers.IntegerField(help_text="Send it back with progress and the result; a stale attempt gets 409.")
    lease_expires_at = serializers.DateTimeField()
    job = serializers.IntegerField()
    variant = TaskVariantSerializer()
    backend = serializers.CharField()
    compile = json_field(ANY_OBJECT, help_text="Compile options the search is measuring (devices.backends.options); {} = the runtime's defaults.")
    files = TaskFilesSerializer()
    benchmark = BenchmarkSettingsSerializer()
    tolerance = json_field(ANY_OBJECT)
    evaluation = json_field(ANY_OBJECT, allow_null=True)
    retime = RetimeOrderSerializer(allow_null=True)


class ProgressAnswerSerializer(serializers.Serializer):
    cancel = serializers.BooleanField(help_text="Stop the task: it was canceled.")
    lease_expires_at = serializers.DateTimeField()
    max_seconds = serializers.FloatField(required=False, allow_null=True, help_text="To a re-timing: how long its rounds may hold the "
                                         "device now (another job's task waits, or an `auto` search's budget is ending), null for the round cap alone.")


class ArtifactUploadPlanAnswerSerializer(serializers.Serializer):
    """How to send the engine: `{"method": "resumable"}` (the agent's resumable uploads), or a presigned PUT straight to the
    storage and the `staged` token to commit it with."""

    method = serializers.ChoiceField(choices=["resumable", "PUT"])
    url = serializers.CharField(required=False)
    headers = serializers.DictField(child=serializers.CharField(), required=False)
    expires_in = serializers.IntegerField(required=False)
    staged = serializers.CharField(required=False)


class ArtifactStoredSerializer(serializers.Serializer):
    sha256 = serializers.CharField()
    artifact = serializers.IntegerField()


class ResultAnswerSerializer(serializers.Serializer):
    ok = serializers.BooleanField()


class AgentRuntimeSerializer(serializers.Serializer):
    name = serializers.CharField()
    package = serializers.CharField()
    note = serializers.CharField(allow_blank=True)


class AgentSetupSerializer(serializers.Serializer):
    """The server's address as devices reach it and how to install the agent there (the Devices page, `kiln devices setup`)."""

    server_url = serializers.CharField()
    source = serializers.ChoiceField(choices=["KILN_PUBLIC_URL", "request"])
    loopback = serializers.BooleanField()
    warning = serializers.CharField(allow_null=True)
    suggested_urls = serializers.ListField(child=serializers.CharField())
    downloads_url = serializers.CharField()
    downloads_configured = serializers.BooleanField()
    agent_distribution = serializers.CharField()
    install_command = serializers.CharField()
    runtimes = AgentRuntimeSerializer(many=True)


class RegistrationTokenCreatedSerializer(RegistrationTokenSerializer):
    """A new registration token: the secret, shown once, and the command that registers a device with it."""

    token = serializers.CharField(read_only=True)
    register_command = serializers.CharField(read_only=True)

    class Meta(RegistrationTokenSerializer.Meta):
        fields = [*RegistrationTokenSerializer.Meta.fields, "token", "register_command"]
        read_only_fields = fields
