from django.urls import reverse
from rest_framework import serializers

from ..models import Dataset, Model, ModelVersion
from ..selectors import model_version_output_kinds


class ModelVersionSerializer(serializers.ModelSerializer):
    sha256 = serializers.CharField(source="blob.sha256", read_only=True)
    size_bytes = serializers.IntegerField(source="blob.size_bytes", read_only=True)
    model = serializers.IntegerField(source="model_id", read_only=True)
    download_url = serializers.SerializerMethodField()
    output_kinds = serializers.SerializerMethodField()

    class Meta:
        model = ModelVersion
        fields = [
            "id", "model", "number", "sha256", "size_bytes", "source_format", "filename", "signature", "opset",
            "op_histogram", "parameter_count", "validation", "output_kinds", "conversion", "created_at", "download_url", "operator_support",
        ]

    def get_output_kinds(self, version) -> dict:
        """Per output: the kind used (`kind`), what Kiln inferred and why, and whether the user overrode it."""
        return model_version_output_kinds(version=version)

    def get_download_url(self, version) -> str:
        return reverse("model-version-download", args=[version.model_id, version.number])


class ModelSerializer(serializers.ModelSerializer):
    versions = ModelVersionSerializer(many=True, read_only=True)
    latest_version = serializers.SerializerMethodField()

    class Meta:
        model = Model
        fields = ["id", "name", "created_at", "latest_version", "versions"]

    def get_latest_version(self, model) -> dict | None:
        versions = list(model.versions.all())
        return ModelVersionSerializer(versions[-1]).data if versions else None


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


class DatasetSerializer(serializers.ModelSerializer):
    sha256 = serializers.CharField(source="blob.sha256", read_only=True)
    size_bytes = serializers.IntegerField(source="blob.size_bytes", read_only=True)
    source_sha256 = serializers.SerializerMethodField()

    class Meta:
        model = Dataset
        fields = ["id", "name", "kind", "samples", "arrays", "has_labels", "format", "recipe", "previews", "sha256", "source_sha256", "size_bytes",
                  "created_at"]

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
