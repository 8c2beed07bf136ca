from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from kiln.core.schema import ANY_OBJECT, DIMENSION, OpenSerializer, json_field
from kiln_contract.contract import OUTPUT_KINDS
from kiln_contract.operator_support import VERDICTS

from ..models import Dataset, Model, ModelVersion
from ..selectors import model_version_output_kinds


class TensorSpecSerializer(OpenSerializer):
    """One input or output of a model: its name, element type and shape (a symbolic dimension is its name, unknown null)."""

    name = serializers.CharField()
    dtype = serializers.CharField()
    shape = serializers.ListField(child=json_field(DIMENSION))


class SignatureSerializer(OpenSerializer):
    inputs = TensorSpecSerializer(many=True, required=False)
    outputs = TensorSpecSerializer(many=True, required=False)


class ValidationResultSerializer(OpenSerializer):
    ok = serializers.BooleanField()
    error = serializers.CharField(allow_null=True, allow_blank=True, required=False)


class OutputKindInfoSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=OUTPUT_KINDS, allow_null=True, help_text="The kind used: the user's override, else what Kiln inferred.")
    inferred = serializers.ChoiceField(choices=OUTPUT_KINDS, allow_null=True)
    reason = serializers.CharField()
    overridden = serializers.BooleanField()


class ParitySerializer(OpenSerializer):
    passed = serializers.BooleanField()
    min_cosine = serializers.FloatField()
    threshold = serializers.FloatField()
    samples = serializers.IntegerField()


class ConversionSerializer(OpenSerializer):
    """A PyTorch upload: how its ONNX was exported, and how closely it matches PyTorch ({} for an ONNX upload)."""

    format = serializers.CharField(required=False)
    exporter = serializers.ChoiceField(choices=["dynamo", "torchscript"], required=False)
    fallback_reason = serializers.CharField(allow_null=True, required=False)
    parity = ParitySerializer(required=False)
    torch_parameter_count = serializers.IntegerField(required=False)


class OperatorCountsField(serializers.DictField):
    child = serializers.IntegerField()


class RuntimeSupportSerializer(OpenSerializer):
    """One runtime's answer to "which of this model's operators do you run?" (devices/support.py), and who gave it."""

    backend = serializers.CharField()
    runtime = serializers.CharField(allow_null=True, required=False)
    version = serializers.CharField(allow_null=True, required=False)
    device = serializers.CharField(allow_null=True, required=False)
    source = serializers.CharField(allow_null=True, required=False)
    verdict = serializers.ChoiceField(choices=list(VERDICTS))
    reason = serializers.CharField(allow_null=True, allow_blank=True, required=False)
    native = OperatorCountsField(required=False)
    fallback = OperatorCountsField(required=False)
    unsupported = OperatorCountsField(required=False)
    nodes = json_field({"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}}, required=False)
    where = serializers.CharField(required=False, help_text='Who answered: "server", or the agent\'s name.')
    at = serializers.CharField(required=False)


class OperatorSupportSerializer(OpenSerializer):
    answers = RuntimeSupportSerializer(many=True, required=False)


class IdenticalVersionSerializer(serializers.Serializer):
    """An earlier version of this organization with exactly the same bytes."""

    model = serializers.IntegerField()
    name = serializers.CharField()
    version = serializers.IntegerField(help_text="Its number.")
    version_id = serializers.IntegerField()


class ModelVersionSerializer(serializers.ModelSerializer):
    sha256 = serializers.CharField(source="blob.sha256", read_only=True)
    size_bytes = serializers.IntegerField(source="blob.size_bytes", read_only=True)
    model = serializers.IntegerField(source="model_id", read_only=True)
    download_url = serializers.SerializerMethodField()
    output_kinds = serializers.SerializerMethodField()
    signature = json_field(SignatureSerializer)
    op_histogram = json_field({"type": "object", "additionalProperties": {"type": "integer"}})
    validation = json_field(ValidationResultSerializer(allow_null=True))
    conversion = json_field(ConversionSerializer)
    operator_support = json_field(OperatorSupportSerializer, help_text="What each runtime said about the operators: the server's, and each agent's.")

    class Meta:
        model = ModelVersion
        fields = [
            "id", "model", "number", "sha256", "size_bytes", "source_format", "filename", "signature", "opset",
            "op_histogram", "parameter_count", "validation", "output_kinds", "conversion", "created_at", "download_url", "operator_support",
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.DictField(child=OutputKindInfoSerializer()))
    def get_output_kinds(self, version) -> dict:
        """Per output: the kind used (`kind`), what Kiln inferred and why, and whether the user overrode it."""
        return model_version_output_kinds(version=version)

    def get_download_url(self, version) -> str:
        return reverse("model-version-download", args=[version.model_id, version.number])


class ModelVersionCreatedSerializer(ModelVersionSerializer):
    identical_to = IdenticalVersionSerializer(many=True, read_only=True, help_text="Earlier versions with exactly the same bytes.")

    class Meta(ModelVersionSerializer.Meta):
        fields = [*ModelVersionSerializer.Meta.fields, "identical_to"]
        read_only_fields = fields


class ModelSerializer(serializers.ModelSerializer):
    versions = ModelVersionSerializer(many=True, read_only=True)
    latest_version = serializers.SerializerMethodField()

    class Meta:
        model = Model
        fields = ["id", "name", "created_at", "latest_version", "versions"]
        read_only_fields = fields

    @extend_schema_field(ModelVersionSerializer(allow_null=True))
    def get_latest_version(self, model) -> dict | None:
        versions = list(model.versions.all())
        return ModelVersionSerializer(versions[-1]).data if versions else None


class ModelCreatedSerializer(ModelSerializer):
    identical_to = IdenticalVersionSerializer(many=True, read_only=True, help_text="Earlier versions with exactly the same bytes.")

    class Meta(ModelSerializer.Meta):
        fields = [*ModelSerializer.Meta.fields, "identical_to"]
        read_only_fields = fields


class FileOrUploadSerializer(serializers.Serializer):
    """Exactly one of `file` (multipart) or `upload` (the id of a finished resumable upload)."""

    file = serializers.FileField(required=False)
    upload = serializers.UUIDField(required=False)

    def validate(self, attrs):
        if ("file" in attrs) == ("upload" in attrs):
            raise serializers.ValidationError("Send either a file (multipart) or the id of a finished upload.")
        return attrs


class ModelUploadSerializer(FileOrUploadSerializer):
    name = serializers.CharField(max_length=200, required=False, allow_blank=True)


class VersionUploadSerializer(FileOrUploadSerializer):
    pass


class ArraySpecSerializer(serializers.Serializer):
    dtype = serializers.CharField()
    shape = serializers.ListField(child=serializers.IntegerField(allow_null=True), help_text="null: a size that varies between samples.")


class DatasetPreviewItemSerializer(OpenSerializer):
    """One sample as the recipe made it: a thumbnail of the tensor, a waveform envelope, or text with its tokens."""

    name = serializers.CharField()
    thumbnail = serializers.CharField(required=False, help_text="A data: URL of the prepared tensor as an image.")
    size = serializers.ListField(child=serializers.IntegerField(), required=False, help_text="An image's [height, width] as the model gets it.")
    seconds = serializers.FloatField(required=False)
    sample_rate = serializers.IntegerField(required=False)
    peak = serializers.FloatField(required=False)
    envelope = serializers.ListField(child=serializers.FloatField(), required=False)
    text = serializers.CharField(required=False, allow_blank=True)
    tokens = serializers.ListField(child=serializers.CharField(allow_blank=True), required=False)
    length = serializers.IntegerField(required=False)
    label = serializers.CharField(allow_null=True, required=False, help_text="The class folder it came from (a preview).")


# A text input fed in another form than the tokenizer's: its own dtype, per-sample shape or an additive mask.
TEXT_INPUT_SPEC = {"type": "object", "additionalProperties": {}, "required": ["field"],
                   "properties": {"field": {"type": "string"}, "dtype": {"type": "string"}, "shape": {"type": "array", "items": {"type": "integer"}},
                                  "additive": {"type": "number"}}}


class DatasetRecipeSerializer(OpenSerializer):
    """The declared preprocessing that turns raw images, audio or text into a model's inputs (devices/recipes.py); {} for arrays."""

    type = serializers.ChoiceField(choices=["image", "audio", "text"], required=False)
    input = serializers.CharField(required=False)
    inputs = serializers.DictField(child=json_field({"oneOf": [{"type": "string"}, TEXT_INPUT_SPEC]}), required=False,
                                   help_text="Per model input: the tokenizer's field it takes, or how to feed it.")
    size = serializers.ListField(child=serializers.IntegerField(), required=False)
    resize = serializers.CharField(required=False)
    color = serializers.CharField(required=False)
    scale = serializers.FloatField(required=False)
    mean = serializers.ListField(child=serializers.FloatField(), required=False)
    std = serializers.ListField(child=serializers.FloatField(), required=False)
    layout = serializers.CharField(required=False)
    dtype = serializers.CharField(required=False)
    sample_rate = serializers.IntegerField(required=False)
    resample = serializers.BooleanField(required=False)
    length = serializers.IntegerField(allow_null=True, required=False)
    max_length = serializers.IntegerField(required=False)
    label_names = serializers.ListField(child=serializers.CharField(), required=False)
    tokenizer_sha256 = serializers.CharField(required=False)


class DatasetSerializer(serializers.ModelSerializer):
    sha256 = serializers.CharField(source="blob.sha256", read_only=True)
    size_bytes = serializers.IntegerField(source="blob.size_bytes", read_only=True)
    source_sha256 = serializers.SerializerMethodField()
    arrays = json_field(serializers.DictField(child=ArraySpecSerializer()))
    recipe = json_field(DatasetRecipeSerializer)
    previews = json_field(DatasetPreviewItemSerializer(many=True))

    class Meta:
        model = Dataset
        fields = ["id", "name", "kind", "samples", "arrays", "has_labels", "format", "recipe", "previews", "sha256", "source_sha256", "size_bytes",
                  "created_at"]
        read_only_fields = fields

    def get_source_sha256(self, dataset) -> str:
        """The digest of the file uploaded (raw images: the zip, before the recipe), so the same files uploaded twice are known."""
        return dataset.source_blob.sha256 if dataset.source_blob_id else dataset.blob.sha256


class DatasetUploadSerializer(FileOrUploadSerializer):
    name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    kind = serializers.ChoiceField(choices=["calibration", "validation"])
    recipe = serializers.CharField(max_length=20_000, required=False, allow_blank=True,
                                   help_text="JSON preprocessing recipe that turns raw images, WAV files or text lines into the model's inputs.")
    tokenizer = serializers.FileField(required=False, help_text="The model's tokenizer.json, for a text recipe.")


# A few hundred thousand file paths, one a line.
MAX_PREVIEW_NAMES_CHARS = 8_000_000


class DatasetPreviewSerializer(FileOrUploadSerializer):
    """A zip of images or WAV files (the first few are read), as `file` or a finished `upload`."""

    recipe = serializers.CharField(max_length=20_000, help_text="The JSON recipe to preview.")
    model_version = serializers.IntegerField(required=False, min_value=1, help_text="Check the tensors against this model version's inputs.")
    names = serializers.CharField(
        max_length=MAX_PREVIEW_NAMES_CHARS, required=False, allow_blank=True, trim_whitespace=False,
        help_text="The paths of every file chosen, one a line, when the zip holds only those to preview: files and classes are counted over them.")


class OutputKindsSerializer(serializers.Serializer):
    output_kinds = serializers.DictField(child=serializers.CharField(allow_null=True, max_length=40), allow_empty=True)


# -- answers built as dicts (their shape in the schema, kiln.core.schema) -----------------------------------

class PreviewArraySerializer(ArraySpecSerializer):
    min = serializers.FloatField(allow_null=True)
    max = serializers.FloatField(allow_null=True)


class RecipeFitSerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    problems = serializers.ListField(child=serializers.CharField())


class RawPreviewSerializer(serializers.Serializer):
    """What a recipe makes of the first files of a zip, checked against a model version when one is given; nothing is stored."""

    files = serializers.IntegerField(help_text="Files counted (every file chosen, when `names` listed them).")
    arrays = serializers.DictField(child=PreviewArraySerializer())
    previews = DatasetPreviewItemSerializer(many=True)
    classes = serializers.DictField(child=serializers.IntegerField(), help_text="Files per class folder.")
    recipe = json_field(DatasetRecipeSerializer)
    fits = RecipeFitSerializer(allow_null=True)
    sandbox = json_field(ANY_OBJECT, required=False, help_text="The confinement the sandbox that read the files ran under.")
    usage = json_field(ANY_OBJECT, required=False, help_text="What that sandbox used: peak memory, CPU and waiting time.")


class RecipeProposalSerializer(serializers.Serializer):
    """The preprocessing recipe Kiln proposes for raw data fed to a model version, and why."""

    recipe = json_field(DatasetRecipeSerializer(allow_null=True))
    input = serializers.CharField(allow_null=True)
    why = serializers.ListField(child=serializers.CharField())


class StorageSerializer(serializers.Serializer):
    """What the organization stores against its quota (KILN_STORAGE_QUOTA_BYTES)."""

    stored_bytes = serializers.IntegerField()
    uploads_in_flight_bytes = serializers.IntegerField()
    used_bytes = serializers.IntegerField()
    quota_bytes = serializers.IntegerField(allow_null=True)
    available_bytes = serializers.IntegerField(allow_null=True)


class UploadSerializer(serializers.Serializer):
    """A resumable upload (tus 1.0.0): send the bytes with PATCH to `url`, from `offset`."""

    id = serializers.UUIDField()
    url = serializers.CharField()
    filename = serializers.CharField(allow_blank=True)
    length = serializers.IntegerField()
    offset = serializers.IntegerField()
    complete = serializers.BooleanField()
    sha256 = serializers.CharField(allow_null=True)
    expires_at = serializers.DateTimeField()
