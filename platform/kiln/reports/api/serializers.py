from rest_framework import serializers

from ..models import Measurement
from ..services import regression_json


class MeasurementSerializer(serializers.ModelSerializer):
    model = serializers.SerializerMethodField()
    agent = serializers.SerializerMethodField()
    regression = serializers.SerializerMethodField()

    class Meta:
        model = Measurement
        fields = [
            "id", "job", "device_task", "model", "model_version", "model_sha256", "op_histogram", "variant_key", "variant_sha256", "precision",
            "effective_precision", "label", "recommended", "timing_source",
            "recipe", "backend", "backend_version", "compile_options", "agent", "device_key", "agent_version", "capabilities", "latency_ms",
            "p50_ms", "std_ms", "runs", "throughput_per_s", "peak_memory_mb", "load_ms", "accuracy", "regression", "measured_at",
        ]

    def get_model(self, row) -> dict:
        return {"id": row.model_id, "name": row.model_name, "version": row.model_version_id}

    def get_agent(self, row) -> dict:
        return {"id": row.agent_id, "name": row.agent_name}

    def get_regression(self, row) -> dict | None:
        return regression_json(row)
