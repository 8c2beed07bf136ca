"""The agent protocol (`/api/agent/v1/`): register, heartbeat, lease, progress, result, files."""
from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.parsers import MultiPartParser
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from kiln.accounts.api.views import CredentialsThrottled
from kiln.core.errors import KilnError
from kiln.core.parsers import AgentResultJSONParser, BoundedJSONParser
from kiln.pipeline.models import DeviceTaskStatus
from kiln.registry.api.views import download_response
from kiln.registry.selectors import blob_file

from .. import services
from ..authentication import AgentTokenAuthentication, IsAgent
from .serializers import (
    ArtifactUploadSerializer,
    HeartbeatSerializer,
    LeaseSerializer,
    ProgressSerializer,
    RegisterSerializer,
    ResultSerializer,
    agent_intervals,
)


class AgentView(APIView):
    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsAgent]
    parser_classes = [BoundedJSONParser]

    @property
    def agent(self):
        return self.request.auth


def _file_entry(task, name: str, blob) -> dict | None:
    if blob is None:
        return None
    return {"url": reverse("agent-task-file", args=[task.id, name]), "sha256": blob.sha256, "size_bytes": blob.size_bytes}


def task_payload(task) -> dict:
    job = task.job
    return {
        "id": task.id,
        "attempt": task.attempt,
        "lease_expires_at": task.lease_expires_at,
        "job": job.id,
        "variant": {"id": task.variant.id, "key": task.variant.key, "precision": task.variant.precision, "recipe": task.variant.recipe},
        "backend": task.backend,
        "files": {
            "model": _file_entry(task, "model", task.variant.artifact.blob),
            "validation": _file_entry(task, "validation", job.validation_blob),
            "reference": _file_entry(task, "reference", job.reference_blob),
        },
        "benchmark": {
            "warmup_runs": settings.BENCHMARK_WARMUP_RUNS,
            "warmup_seconds": settings.BENCHMARK_WARMUP_SECONDS,
            "min_runs": settings.BENCHMARK_MIN_RUNS,
            "min_seconds": settings.BENCHMARK_MIN_SECONDS,
            "batch_sizes": [1],
        },
        "tolerance": job.tolerance,
        "evaluation": job.evaluation or None,
    }


class RegisterView(CredentialsThrottled, APIView):
    authentication_classes = []
    permission_classes = [AllowAny]
    parser_classes = [BoundedJSONParser]

    @extend_schema(request=RegisterSerializer, responses={201: dict})
    def post(self, request):
        data = RegisterSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        agent, secret = services.agent_register(
            registration_secret=data.validated_data["registration_token"],
            name=data.validated_data["name"],
            labels=data.validated_data["labels"],
            capabilities=data.validated_data["capabilities"],
        )
        return Response({"agent_id": agent.id, "agent_token": secret, **agent_intervals()}, status=status.HTTP_201_CREATED)


class HeartbeatView(AgentView):
    @extend_schema(request=HeartbeatSerializer, responses={200: dict})
    def post(self, request):
        data = HeartbeatSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        cancel = services.agent_heartbeat(agent=self.agent, capabilities=data.validated_data["capabilities"], running_task=data.validated_data["running_task"])
        return Response({"cancel": cancel, **agent_intervals()})


class LeaseView(AgentView):
    @extend_schema(request=LeaseSerializer, responses={200: dict, 204: None})
    def post(self, request):
        data = LeaseSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        task = services.device_task_lease(agent=self.agent, wait_s=data.validated_data["wait_s"])
        if task is None:
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response(task_payload(task))


class ProgressView(AgentView):
    @extend_schema(request=ProgressSerializer, responses={200: dict})
    def post(self, request, task_id: int):
        data = ProgressSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        answer = services.device_task_progress(agent=self.agent, task_id=task_id, **data.validated_data)
        return Response(answer)


class ArtifactView(AgentView):
    parser_classes = [MultiPartParser]

    @extend_schema(request=ArtifactUploadSerializer, responses={201: dict})
    def post(self, request, task_id: int):
        data = ArtifactUploadSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        upload = data.validated_data["file"]
        artifact = services.device_task_store_artifact(
            agent=self.agent, task_id=task_id, attempt=data.validated_data["attempt"], path=Path(upload.temporary_file_path()), filename=upload.name
        )
        return Response({"sha256": artifact.blob.sha256, "artifact": artifact.id}, status=status.HTTP_201_CREATED)


class ResultView(AgentView):
    parser_classes = [AgentResultJSONParser]

    @extend_schema(request=ResultSerializer, responses={200: dict})
    def post(self, request, task_id: int):
        data = ResultSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        services.device_task_result(
            agent=self.agent,
            task_id=task_id,
            attempt=values["attempt"],
            status=values["status"],
            error=values.get("error") or "",
            metrics=values.get("metrics") or {},
            accuracy=values.get("accuracy") or {},
            profile=values.get("profile") or {},
            log=values.get("log") or "",
        )
        return Response({"ok": True})


class TaskFileView(AgentView):
    FILES = {"model", "validation", "reference"}

    @extend_schema(responses={(200, "application/octet-stream"): bytes})
    def get(self, request, task_id: int, name: str):
        if name not in self.FILES:
            raise KilnError("Not found.", code="not_found", status_code=404)
        task = services.device_task_for_agent(agent=self.agent, task_id=task_id, attempt=None)
        if task.status != DeviceTaskStatus.LEASED:
            raise KilnError("The task is no longer leased.", code="not_leased", status_code=409)
        blob = {"model": task.variant.artifact.blob if task.variant.artifact else None, "validation": task.job.validation_blob, "reference": task.job.reference_blob}[name]
        if blob is None:
            raise KilnError("Not found.", code="not_found", status_code=404)
        return download_response(blob_file(blob), f"task{task.id}-{name}{'.onnx' if name == 'model' else '.npz'}")
