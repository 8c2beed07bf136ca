"""The shapes of the reports app's answers: the report with its one decision per device, the performance database, estimates.

The report is built as a dict (kiln.reports.selectors `job_report`) and sent as it is; every serializer here but
MeasurementSerializer states a shape in the OpenAPI schema and renders nothing (see kiln.core.schema).
"""
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from kiln.core.schema import ANY_OBJECT, OpenSerializer, json_field
from kiln.fleet.api.serializers import ProfileSerializer
from kiln.pipeline.api.serializers import CalibrationSubsetSerializer, DeclaredMetricSerializer, EvaluationPlanSerializer, ToleranceSerializer
from kiln.pipeline.models import JobStatus
from kiln_contract.paired import STOP_REASONS

from ..models import Measurement
from ..selectors import MEASUREMENT_SETS
from ..services import regression_json

COMPARISONS = ["faster", "slower", "tie"]


def _number(**kwargs) -> serializers.FloatField:
    return serializers.FloatField(allow_null=True, **kwargs)


def _count(**kwargs) -> serializers.IntegerField:
    return serializers.IntegerField(allow_null=True, **kwargs)


def _text(**kwargs) -> serializers.CharField:
    return serializers.CharField(allow_null=True, allow_blank=True, **kwargs)


def _texts(**kwargs) -> serializers.ListField:
    return serializers.ListField(child=serializers.CharField(allow_blank=True), **kwargs)


def _numbers(**kwargs) -> serializers.ListField:
    return serializers.ListField(child=serializers.FloatField(), **kwargs)


# -- measured figures --------------------------------------------------------------------------------

class LatencyMsSerializer(serializers.Serializer):
    """Latency in milliseconds over a benchmark's runs (devices/bench.py); an agent of an earlier release sent fewer figures."""

    p50 = serializers.FloatField()
    p90 = _number(required=False)
    p99 = _number(required=False)
    mean = _number(required=False)
    std = _number(required=False)
    cv = _number(required=False)
    min = _number(required=False)
    max = _number(required=False)
    count = _count(required=False)
    # The performance database keeps the windows its noise is judged by beside the figures.
    window_medians_ms = _numbers(required=False)


class LoadSerializer(serializers.Serializer):
    loadavg = serializers.ListField(child=serializers.FloatField(), allow_null=True, required=False)
    cpu_mhz = _number(required=False)


class QuietWindowSerializer(serializers.Serializer):
    """One quiet timing window (devices/quiet.py `Window.as_dict`): the load around it and whether it was re-taken."""

    attempt = _count(required=False)
    started_at = _number(required=False)
    seconds = _number(required=False)
    waited_s = _number(required=False)
    builds_paused = serializers.BooleanField(allow_null=True, required=False)
    before = LoadSerializer(allow_null=True, required=False)
    after = LoadSerializer(allow_null=True, required=False)
    competing_cores = _number(required=False)
    limit_cores = _number(required=False)
    busy = serializers.BooleanField(allow_null=True, required=False)
    busiest = _texts(required=False)
    retaken = _count(required=False)


class FirstPassSerializer(serializers.Serializer):
    """Every figure of a task's own benchmark, kept apart from a re-timed row's side-by-side figures."""

    latency_ms = LatencyMsSerializer(allow_null=True)
    throughput_per_s = _number()
    batch_size = _count()
    peak_memory_mb = _number()
    load_ms = _number()
    first_inference_ms = _number()
    window_medians_ms = _numbers()
    windows = QuietWindowSerializer(many=True)


class TimingSerializer(serializers.Serializer):
    """The samples the noise of a row's latency is judged by (workers/noise.py)."""

    source = serializers.ChoiceField(choices=MEASUREMENT_SETS)
    window_medians_ms = _numbers()
    interleaved_medians_ms = _numbers(required=False)
    windows = QuietWindowSerializer(many=True)


class StepOutputSerializer(serializers.Serializer):
    cosine = _number()
    max_abs_error = _number()


class PerStepSerializer(serializers.Serializer):
    """One step of a sequence job's accuracy (devices/feeds.py `per_step_figures`): every sequence's call t against FP32's."""

    step = serializers.IntegerField()
    sequences = serializers.IntegerField()
    outputs = serializers.DictField(child=StepOutputSerializer())


class AccuracySerializer(OpenSerializer):
    """A variant's accuracy against FP32 and the tolerance (kiln_contract/contract.py `score_accuracy`): the worst primary output's
    figures, then every metric measured (cosine, sqnr_db, top1_agreement, accuracy against labels, per-output figures...)."""

    metric = _text(required=False)
    output = _text(required=False)
    value = _number()
    reference_value = _number(required=False)
    drop = _number(required=False)
    within_tolerance = serializers.BooleanField()
    reason = _text(required=False)
    per_step = PerStepSerializer(many=True, required=False)


class FileRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    sha256 = serializers.CharField()
    download_url = serializers.CharField()


class AgentRefSerializer(serializers.Serializer):
    id = _count()
    name = serializers.CharField()


class RegressionSerializer(serializers.Serializer):
    """How a measurement compares with the latest earlier one of the same model, variant, backend and device."""

    flagged = serializers.BooleanField(allow_null=True)
    slowdown = _number()
    baseline = serializers.IntegerField()
    baseline_job = _count()
    baseline_p50_ms = serializers.FloatField()
    baseline_backend_version = serializers.CharField(allow_blank=True)


class ReportVariantSerializer(serializers.Serializer):
    """One variant measured on one device (kiln.reports.selectors `_entry`); `id` is the device task that measured it. Every
    figure of the row comes from one measurement set (`measurement_set`); a re-timed row keeps its first pass apart."""

    id = serializers.IntegerField()
    task = serializers.IntegerField()
    variant = serializers.IntegerField()
    key = serializers.CharField()
    label = serializers.CharField(help_text="What runs, named (kiln_contract/labels.py): effective precision first, then recipe, options, backend.")
    effective_precision = serializers.CharField(help_text="fp32, bf16, fp16, int8, int4 weights or mixed.")
    backend = serializers.CharField()
    precision = serializers.CharField()
    recipe = json_field(ANY_OBJECT)
    options = json_field(ANY_OBJECT)
    compile = json_field(ANY_OBJECT)
    round = serializers.IntegerField()
    status = serializers.CharField()
    error = _text()
    agent = AgentRefSerializer(allow_null=True)
    measurement_set = serializers.ChoiceField(choices=MEASUREMENT_SETS, required=False)
    latency_ms = LatencyMsSerializer(allow_null=True)
    throughput_per_s = _number()
    batch_size = _count(required=False)
    load_ms = _number()
    first_inference_ms = _number(required=False)
    peak_memory_mb = _number()
    first_pass = FirstPassSerializer(required=False)
    latency_ms_first_pass = LatencyMsSerializer(allow_null=True, required=False)
    threads = _count(required=False)
    unstable = serializers.BooleanField(allow_null=True, required=False)
    busy = serializers.BooleanField(required=False, help_text="A quiet window stayed busy after its re-takes: the figure is marked.")
    timing = TimingSerializer(required=False)
    size_bytes = _count()
    accuracy = AccuracySerializer()
    profile = json_field(ProfileSerializer, help_text="Time per operator on the device ({} when not profiled).")
    artifact = FileRefSerializer(allow_null=True, help_text="The compiled engine, else the variant.")
    variant_artifact = FileRefSerializer(allow_null=True, help_text="The host-side ONNX variant.")
    pareto = serializers.BooleanField()
    measurement = serializers.IntegerField(required=False, help_text="Its row in the performance database (a stored report).")
    regression = RegressionSerializer(allow_null=True, required=False)


# -- the decision ----------------------------------------------------------------------------------

class LatencyRatioSerializer(serializers.Serializer):
    """How much faster one variant is than another (`ratio` above 1: faster), with its interval and what it says
    (workers/noise.py `LatencyRatio`): wholly above 1.0 is faster, wholly below slower, an interval containing 1.0 a tie."""

    ratio = serializers.FloatField()
    low = serializers.FloatField()
    high = serializers.FloatField()
    source = serializers.CharField(help_text="What the interval comes from: side-by-side rounds, timing windows, or the runs' spread.")
    comparison = serializers.ChoiceField(choices=COMPARISONS)
    beyond_noise = serializers.BooleanField()
    rounds = _count()
    per_round = _numbers()
    ratio_text = serializers.CharField(help_text='The ratio as the server prints it ("1.03x").')
    interval_text = serializers.CharField(help_text='The interval with the digits that decide it ("1.002x to 1.05x").')


class SpeedupSerializer(LatencyRatioSerializer):
    """The recommended variant against FP32 on the same device."""

    baseline = serializers.IntegerField(help_text="The FP32 entry's id.")
    baseline_label = serializers.CharField()


class TiedVariantSerializer(LatencyRatioSerializer):
    """A variant that measured faster than the recommended one without being faster beyond noise, and why it lost."""

    variant = serializers.IntegerField()
    label = serializers.CharField()
    reason = serializers.CharField()


class DecisionAccuracySerializer(serializers.Serializer):
    metric = _text()
    value = _number()
    drop = _number()


class AlternativeSerializer(serializers.Serializer):
    """Why not another family (its best variant) or a failed build: one row of the decision's "why not the others"."""

    family = serializers.CharField()
    variants = serializers.IntegerField()
    variant = _count(help_text="The entry's id; null for a build that never reached the device.")
    build = _count(required=False, help_text="A build that never reached the device: the variant's id.")
    label = serializers.CharField()
    p50_ms = _number()
    drop = _number()
    metric = _text()
    outcome = serializers.CharField(help_text="slower, tie, faster, outside tolerance, failed, build failed, refused, not measured, "
                                              "measuring, not chosen.")
    why = serializers.CharField(allow_blank=True)


class DecisionNoiseSerializer(serializers.Serializer):
    """The device's timing noise, told once (a report stored before decisions has only `text`)."""

    text = serializers.CharField(allow_blank=True)
    unstable = serializers.IntegerField(required=False)
    timed = serializers.IntegerField(required=False)
    retaken = serializers.IntegerField(required=False)
    busy = serializers.IntegerField(required=False)
    unpaused = serializers.IntegerField(required=False)
    max_spread = serializers.FloatField(required=False)


class FinalistSerializer(serializers.Serializer):
    variant = serializers.IntegerField()
    label = serializers.CharField()
    p50_ms = serializers.FloatField()
    round_medians_ms = _numbers()
    against_recommended = LatencyRatioSerializer(required=False)


class DecisionMeasurementSerializer(serializers.Serializer):
    """The finalists timed side by side (the device's RETIME task): rounds, why they stopped, each finalist's rounds."""

    source = serializers.CharField()
    rounds = serializers.IntegerField()
    stopped = serializers.ChoiceField(choices=list(STOP_REASONS), allow_null=True)
    stopped_text = serializers.CharField(allow_blank=True)
    finalists = FinalistSerializer(many=True)


class ProvisionalSerializer(serializers.Serializer):
    """Set when the windows the decision rests on were busy: the decision says so, and is re-timed once the device is quiet."""

    busy = serializers.IntegerField()
    windows = serializers.IntegerField()
    attempts = serializers.IntegerField()
    busiest = _texts()
    text = serializers.CharField()


class DecisionSerializer(serializers.Serializer):
    """The recommendation on one device (workers/scoring.py `decide`), computed once by the server: the report page, the job
    page, the CLI and the package README render it; none recomputes it."""

    variant = _count(help_text="The recommended entry's id; null when nothing was measured.")
    label = _text()
    effective_precision = _text()
    backend = _text()
    text = serializers.CharField(help_text='The decision in words ("Use int8 · … : 2.41x faster than FP32 …").')
    speed = _text(help_text="The speed clause against FP32.")
    short = _text(help_text='The short cell for lists ("2.41x faster", "1.04x (tie)", "FP32 itself").')
    cost = _text(help_text="The accuracy cost in words.")
    comparison = serializers.ChoiceField(choices=COMPARISONS, allow_null=True)
    tie = serializers.BooleanField()
    tied_with = TiedVariantSerializer(many=True)
    speedup = SpeedupSerializer(allow_null=True)
    accuracy = DecisionAccuracySerializer(allow_null=True)
    within_tolerance = serializers.BooleanField()
    alternatives = AlternativeSerializer(many=True)
    noise = DecisionNoiseSerializer()
    measurement = DecisionMeasurementSerializer(allow_null=True)
    provisional = ProvisionalSerializer(allow_null=True)


# -- the report --------------------------------------------------------------------------------------

class Fp32NoiseSerializer(serializers.Serializer):
    """What FP32 itself scores on the device, per backend: what "1%" is read against."""

    backend = serializers.CharField()
    metric = _text()
    output = _text()
    value = _number()
    drop = _number()
    sqnr_db = _number()
    within_tolerance = serializers.BooleanField(allow_null=True)


class PackageRefSerializer(FileRefSerializer):
    name = serializers.CharField()


class DeviceEstimateSerializer(serializers.Serializer):
    """What the performance database predicted for FP32 on the device before measuring, from other models only."""

    backend = serializers.CharField()
    estimated_p50_ms = _number()
    measured_p50_ms = serializers.FloatField()
    error = _number()
    coverage = serializers.FloatField()
    models = serializers.IntegerField()
    note = serializers.CharField(required=False)


class ReportAgentSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    capabilities = json_field(ANY_OBJECT)
    labels = serializers.DictField(child=serializers.CharField(allow_blank=True))


class ReportDeviceSerializer(serializers.Serializer):
    """One device's part of the report: every variant measured there and its one decision."""

    agent = ReportAgentSerializer(allow_null=True)
    target = serializers.CharField(help_text='"agent:5" or a label selector such as "label:rack=a".')
    variants = ReportVariantSerializer(many=True)
    recommended = _count(help_text="The recommended entry's id (the decision's `variant`).")
    reason = serializers.CharField(allow_blank=True, help_text="The decision's text.")
    final = serializers.BooleanField(help_text="False while the job runs: the results measured so far.")
    decision = DecisionSerializer(allow_null=True)
    fp32_noise = Fp32NoiseSerializer(many=True)
    package = PackageRefSerializer(allow_null=True)
    estimate = DeviceEstimateSerializer(allow_null=True)


class FeedPlanSerializer(serializers.Serializer):
    mode = serializers.CharField()
    format = serializers.CharField()


class CalibrationUsedSerializer(OpenSerializer):
    """The calibration samples a job used (workers/calibration_set.py): how many, drawn how, and which."""

    samples = serializers.IntegerField()
    calls = serializers.IntegerField(required=False)
    of = serializers.IntegerField(required=False)
    seed = _count(required=False)
    stratified = serializers.BooleanField(required=False)
    by_label = serializers.DictField(child=serializers.IntegerField(), allow_null=True, required=False)
    indices = serializers.ListField(child=serializers.IntegerField(), required=False)
    indices_listed = serializers.IntegerField(required=False)


class ReportDatasetsSerializer(serializers.Serializer):
    """How the job's data was fed (layout, state carried) and which calibration samples were used."""

    calibration = FeedPlanSerializer(required=False)
    validation = FeedPlanSerializer(required=False)
    state = serializers.DictField(child=serializers.CharField())
    calibration_subset = CalibrationSubsetSerializer(allow_null=True)
    calibration_used = CalibrationUsedSerializer(allow_null=True)


class TriedVariantSerializer(serializers.Serializer):
    key = serializers.CharField()
    effective_precision = serializers.CharField()
    backends = _texts()
    status = serializers.CharField()
    error = serializers.CharField(allow_blank=True)


class TriedRoundSerializer(serializers.Serializer):
    round = serializers.IntegerField()
    variants = TriedVariantSerializer(many=True)


class SensitivityRowSerializer(OpenSerializer):
    node = serializers.CharField()
    op_type = serializers.CharField()
    sqnr_db = serializers.FloatField()
    relative_error = _number(required=False)


class FamilyVerdictSerializer(OpenSerializer):
    """Whether a precision family paid on this device, from the rows of its table (workers/quantize/verdicts.py)."""

    family = serializers.CharField()
    speedup = serializers.DictField(child=serializers.FloatField(allow_null=True))
    paying_backends = _texts()
    reason = serializers.CharField()


class CompileOutcomeSerializer(OpenSerializer):
    """Which compile options won on a backend, against its defaults."""

    backend = serializers.CharField()
    text = serializers.CharField()


class SearchSummarySerializer(serializers.Serializer):
    """What the search did: rounds and what each tried, the sensitivity ranking (or why none), its budget and, per device
    target, why each family was searched or dropped and which compile options won."""

    auto = serializers.BooleanField()
    rounds = serializers.IntegerField()
    tried = TriedRoundSerializer(many=True)
    sensitivity = SensitivityRowSerializer(many=True)
    sensitivity_note = serializers.CharField(allow_blank=True)
    budget_minutes = _number()
    stopped = _text()
    notes = serializers.DictField(child=_texts())
    verdicts = serializers.DictField(child=serializers.DictField(child=FamilyVerdictSerializer()))
    compile = serializers.DictField(child=CompileOutcomeSerializer(many=True))


class DeviceToolchainSerializer(serializers.Serializer):
    agent_version = serializers.CharField(allow_blank=True)
    runtimes = serializers.DictField(child=serializers.CharField(allow_blank=True))


class ReportToolchainSerializer(serializers.Serializer):
    host = json_field(ANY_OBJECT, help_text="The host-side versions when the job was created.")
    devices = serializers.DictField(child=DeviceToolchainSerializer())


class RerunLatencySerializer(serializers.Serializer):
    variant_key = serializers.CharField()
    backend = serializers.CharField()
    agent = serializers.CharField()
    before_p50_ms = serializers.FloatField()
    after_p50_ms = serializers.FloatField()
    ratio = _number()
    regression = serializers.BooleanField(allow_null=True)


class RerunSerializer(serializers.Serializer):
    """What changed since the job this one repeats: toolchain versions, and each variant's p50."""

    job = serializers.IntegerField()
    differences = _texts()
    latency = RerunLatencySerializer(many=True)


class ReportSerializer(serializers.Serializer):
    """`GET jobs/{id}/report/`: per device, every variant measured and the one decision; while the job runs, the results
    measured so far (`final: false`)."""

    job = serializers.IntegerField()
    status = serializers.ChoiceField(choices=JobStatus.choices)
    tolerance = ToleranceSerializer()
    metrics = DeclaredMetricSerializer(many=True)
    evaluation = EvaluationPlanSerializer(allow_null=True)
    datasets = ReportDatasetsSerializer()
    search = SearchSummarySerializer()
    devices = ReportDeviceSerializer(many=True)
    toolchain = ReportToolchainSerializer()
    rerun = RerunSerializer(allow_null=True)


# -- the performance database ------------------------------------------------------------------------

class MeasuredModelSerializer(serializers.Serializer):
    id = _count()
    name = serializers.CharField()
    version = _count(help_text="The model version's id.")


class MeasurementSerializer(serializers.ModelSerializer):
    model = serializers.SerializerMethodField()
    agent = serializers.SerializerMethodField()
    regression = serializers.SerializerMethodField()
    latency_ms = json_field(LatencyMsSerializer)
    accuracy = json_field(ANY_OBJECT)

    class Meta:
        model = Measurement
        fields = [
            "id", "job", "device_task", "model", "model_version", "model_sha256", "op_histogram", "variant_key", "variant_sha256", "precision",
            "effective_precision", "label", "recommended", "timing_source",
            "recipe", "backend", "backend_version", "compile_options", "agent", "device_key", "agent_version", "capabilities", "latency_ms",
            "p50_ms", "std_ms", "runs", "throughput_per_s", "peak_memory_mb", "load_ms", "accuracy", "regression", "measured_at",
        ]
        read_only_fields = fields

    @extend_schema_field(MeasuredModelSerializer)
    def get_model(self, row) -> dict:
        return {"id": row.model_id, "name": row.model_name, "version": row.model_version_id}

    @extend_schema_field(AgentRefSerializer)
    def get_agent(self, row) -> dict:
        return {"id": row.agent_id, "name": row.agent_name}

    @extend_schema_field(RegressionSerializer(allow_null=True))
    def get_regression(self, row) -> dict | None:
        return regression_json(row)


class EstimateRowSerializer(serializers.Serializer):
    """A model version's estimated FP32 p50 on one device and backend (kiln.reports.estimate `estimate_range`)."""

    agent = AgentRefSerializer()
    device = serializers.CharField()
    backend = serializers.CharField()
    p50_ms = serializers.FloatField()
    low_ms = serializers.FloatField(help_text="The range: the estimate divided and multiplied by `factor`.")
    high_ms = serializers.FloatField()
    factor = serializers.FloatField(help_text="The worst leave-one-out miss on the device (or a prior).")
    checked_models = serializers.IntegerField(help_text="How many of the device's models were predicted from the others (0: the prior).")
    coverage = serializers.FloatField()
    models = serializers.IntegerField()


class EstimateMeasuredSerializer(serializers.Serializer):
    agent_name = serializers.CharField()
    backend = serializers.CharField()
    p50_ms = serializers.FloatField()
    job_id = _count()


class ModelEstimateSerializer(serializers.Serializer):
    """`GET performance/estimate/`: a model version's estimated FP32 latency on every device measured with other models."""

    model_version = serializers.IntegerField()
    work = json_field(ANY_OBJECT, help_text="The model's work per op type (workers/cost.py `op_work`).")
    devices = EstimateRowSerializer(many=True)
    measured = EstimateMeasuredSerializer(many=True)


class SigningKeySerializer(serializers.Serializer):
    public_key_pem = serializers.CharField()
    fingerprint = serializers.CharField()
    algorithm = serializers.ChoiceField(choices=["Ed25519"])


class PackageKeySerializer(serializers.Serializer):
    key = serializers.CharField(help_text="The organization's AES-256 key, base64.")
    key_id = serializers.CharField()
    algorithm = serializers.ChoiceField(choices=["AES-256-GCM"])
