"""The shapes of the plain Django JSON views under /api/v1/ (health, downloads), for the OpenAPI schema (kiln.core.schema)."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.views import APIView


class HealthSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=["ok"])
    database = serializers.CharField(help_text="The database's vendor: postgresql or sqlite.")
    broker = serializers.CharField(help_text="The Celery broker's scheme (redis).")


# The wheels the server serves at /downloads/ (kiln.core.downloads reads their file names with these).
DISTRIBUTIONS = ("contract", "agent", "client")


class WheelSerializer(serializers.Serializer):
    name = serializers.CharField()
    distribution = serializers.ChoiceField(choices=list(DISTRIBUTIONS))
    version = serializers.CharField()
    size_bytes = serializers.IntegerField()
    sha256 = serializers.CharField()
    url = serializers.CharField()


class InstallCommandsSerializer(serializers.Serializer):
    agent = serializers.CharField()
    agent_openvino = serializers.CharField()
    client = serializers.CharField(required=False)


class DownloadsSerializer(serializers.Serializer):
    """The agent's and the client's wheels this server serves, with the pip commands that install them from it."""

    url = serializers.CharField()
    files = WheelSerializer(many=True)
    install = InstallCommandsSerializer(allow_null=True)
    hint = serializers.CharField(allow_null=True, help_text="How to build the wheels, when none is served.")


def schema_only_view(method: str, serializer, description: str) -> type[APIView]:
    """An APIView that gives a plain Django view its place in the OpenAPI schema (drf-spectacular finds a view by `.cls`);
    requests never reach it."""

    @extend_schema(responses={200: serializer}, description=description)
    def handler(self, request):  # pragma: no cover - the plain view serves the requests
        raise NotImplementedError

    return type(f"{serializer.__name__.removesuffix('Serializer')}View", (APIView,),
                {method: handler, "authentication_classes": [], "permission_classes": [AllowAny]})


def document(view, method: str, serializer, description: str):
    """Mark the plain Django view `view` as answering `method` with `serializer`'s shape; returns the view."""
    view.cls = schema_only_view(method, serializer, description)
    view.initkwargs = {}
    return view
