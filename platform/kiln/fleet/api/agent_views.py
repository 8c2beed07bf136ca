"""The agent protocol (`/api/agent/v1/`): register, heartbeat, lease, progress, result, files."""
from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpResponse, JsonResponse
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, status
from rest_framework.parsers import MultiPartParser
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from devices.bench import INTERLEAVED_WINDOW
from kiln.accounts.api.views import CredentialsThrottled
from kiln.core.db import run_in_db_thread
from kiln.core.errors import KilnError, RequestTooLarge, error_body
from kiln.core.parsers import AgentResultJSONParser, BoundedJSONParser
from kiln.core.tokens import bearer_secret
from kiln.pipeline.models import DeviceTaskPurpose, DeviceTaskStatus
from kiln.pipeline.retime import RETIME_ROUNDS, quiet_wait_s, retimed_tasks, rounds_seconds
from kiln.registry.api.views import UploadDetailView, UploadListView, download_response
from kiln.registry.services import storage_quota_check
from kiln_contract.paired import MIN_ROUNDS

from .. import artifact_uploads, services
from ..authentication import AgentTokenAuthentication, IsAgent
from ..intervals import agent_intervals, interval_headers
from ..selectors import agent_from_secret_cached
from .agent_bodies import body_validate, read_raw_body
from .serializers import (
    ArtifactStoredSerializer,
    ArtifactUploadPlanAnswerSerializer,
    ArtifactUploadPlanSerializer,
    ArtifactUploadSerializer,
    HeartbeatAnswerSerializer,
    HeartbeatSerializer,
    LeasedTaskSerializer,
    LeaseSerializer,
    ProgressAnswerSerializer,
    ProgressSerializer,
    RegisteredSerializer,
    RegisterSerializer,
    ResultAnswerSerializer,
    ResultSerializer,
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
        # Compile options the search is measuring (devices.backends.options); {} = the runtime's defaults.
        "compile": task.variant.options.get("compile") or {},
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
        "retime": _retime_payload(task),
    }


def _retime_payload(task) -> dict | None:
    """For a RETIME task: the variants to time side by side, each with its model file, and the server's window settings."""
    if task.purpose != DeviceTaskPurpose.RETIME:
        return None
    return {
        # `rounds` is the cap; the agent stops earlier once the leader separates (kiln_contract/paired.py).
        "rounds": min(int((task.retime or {}).get("rounds") or RETIME_ROUNDS), settings.RETIME_MAX_ROUNDS),
        "min_rounds": int((task.retime or {}).get("min_rounds") or MIN_ROUNDS),
        "window": INTERLEAVED_WINDOW,
        # Set when the last rounds were busy (kiln.pipeline.retime `retime_when_quiet`): wait this long for a quiet device first.
        "wait_for_quiet_s": quiet_wait_s(task),
        # Set while another job's task waits for this device: the rounds stop after this long (their minimum still holds).
        "max_seconds": rounds_seconds(task),
        "variants": [{"task": other.id, "key": other.variant.key, "backend": other.backend,
                      "compile": other.variant.options.get("compile") or {},
                      "model": _file_entry(task, f"{RETIME_FILE_PREFIX}{other.id}", other.variant.artifact.blob if other.variant.artifact else None)}
                     for other in retimed_tasks(task)],
    }


class RegisterView(CredentialsThrottled, APIView):
    authentication_classes = []
    permission_classes = [AllowAny]
    parser_classes = [BoundedJSONParser]

    @extend_schema(request=RegisterSerializer, responses={201: RegisteredSerializer})
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
    """The heartbeat's place in the OpenAPI schema; requests are served by `heartbeat_view` (async)."""

    @extend_schema(request=HeartbeatSerializer, responses={200: HeartbeatAnswerSerializer})
    def post(self, request):  # pragma: no cover - routed to heartbeat_view
        raise NotImplementedError


class LeaseView(AgentView):
    """The long-poll's place in the OpenAPI schema; requests are served by `lease_view` (async)."""

    @extend_schema(request=LeaseSerializer, responses={200: LeasedTaskSerializer, 204: None})
    def post(self, request):  # pragma: no cover - routed to lease_view
        raise NotImplementedError


def _json_error(exc: exceptions.APIException, status_code: int | None = None) -> JsonResponse:
    code = exc.error_code if isinstance(exc, KilnError) else exc.get_codes() if isinstance(exc.get_codes(), str) else exc.default_code
    message = exc.message if isinstance(exc, KilnError) else str(exc.detail)
    return JsonResponse(error_body(message, code), status=status_code or exc.status_code)


def _authenticated_agent(request):
    """The agent behind the request's bearer token, or an APIException (401)."""
    result = AgentTokenAuthentication().authenticate(request)
    if result is None:
        raise exceptions.NotAuthenticated("Send the agent token: Authorization: Bearer kiln_agt_…")
    return result[1]


async def _agent_request(request, serializer_class, *, heartbeat: bool = False):
    """What every async agent route checks, in DRF's order: POST, the agent token (401), the body (413, 400).

    Returns (agent, validated data, None), or (None, None, the error response).
    """
    if request.method != "POST":
        return None, None, JsonResponse(error_body("Use POST.", "method_not_allowed"), status=405)
    secret = bearer_secret(request)
    # A token this process checked a moment ago needs no trip to a database thread.
    agent = agent_from_secret_cached(secret=secret) if secret else None
    try:
        if agent is None:
            agent = await run_in_db_thread(_authenticated_agent, heartbeat=heartbeat, request=request)
    except exceptions.APIException as exc:
        response = _json_error(exc, 401)
        response["WWW-Authenticate"] = 'Bearer realm="kiln-agent"'
        return None, None, response
    try:
        values, errors = body_validate(serializer_class, read_raw_body(request))
    except (exceptions.ParseError, RequestTooLarge) as exc:
        return None, None, _json_error(exc)
    if errors is not None:
        message = "; ".join(f"{k}: {' '.join(map(str, v))}" for k, v in errors.items())
        return None, None, JsonResponse(error_body(message, "invalid", errors), status=400)
    return agent, values, None


# The two calls every agent makes all the time are async views without DRF's request cycle: no
# thread per request (kiln.core.asgi), one trip to the database thread for the work itself.

@csrf_exempt
async def heartbeat_view(request):
    """`POST heartbeat`: the agent is alive; the answer lists the tasks it must stop.

    Sent by an agent that runs a task (and once when it starts); an idle agent's long-poll is its heartbeat.
    """
    agent, values, refusal = await _agent_request(request, HeartbeatSerializer, heartbeat=True)
    if refusal is not None:
        return refusal
    change = {"agent": agent, "capabilities": values["capabilities"], "running_task": values["running_task"]}
    # An idle agent's heartbeat is noted in memory (kiln.fleet.heartbeats): no database, no thread.
    cancel = [] if services.agent_heartbeat_idle(**change) else await run_in_db_thread(services.agent_heartbeat, heartbeat=True, **change)
    return JsonResponse({"cancel": cancel, **agent_intervals()})


@csrf_exempt
async def lease_view(request):
    """`POST tasks/lease`: wait up to `wait_s` for a task without holding a thread or a database loop.

    It is also the heartbeat of an agent that runs nothing: such an agent sends no other request.
    """
    agent, values, refusal = await _agent_request(request, LeaseSerializer)
    if refusal is not None:
        return refusal
    task = await services.device_task_lease(agent=agent, wait_s=values["wait_s"])
    # The long-poll is an idle agent's heartbeat: its answer carries the intervals a heartbeat's would.
    if task is None:
        return HttpResponse(status=status.HTTP_204_NO_CONTENT, headers=interval_headers())
    # task_payload reads more rows for a RETIME task: off the event loop, like every query here.
    return JsonResponse(await run_in_db_thread(task_payload, task=task), encoder=DjangoJSONEncoder, headers=interval_headers())


# drf-spectacular finds endpoints through `.cls`; the schemas come from HeartbeatView and LeaseView.
heartbeat_view.cls = HeartbeatView
heartbeat_view.initkwargs = {}
lease_view.cls = LeaseView
lease_view.initkwargs = {}


class ProgressView(AgentView):
    @extend_schema(request=ProgressSerializer, responses={200: ProgressAnswerSerializer})
    def post(self, request, task_id: int):
        data = ProgressSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        answer = services.device_task_progress(agent=self.agent, task_id=task_id, **data.validated_data)
        return Response(answer)


class AgentUploadActorMixin:
    """Agents upload engines resumably too; an upload belongs to the agent that started it."""

    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsAgent]

    def actor(self, request) -> tuple[object, str]:
        return request.auth.organization, f"agent:{request.auth.id}"

    def upload_url(self, upload) -> str:
        return reverse("agent-upload-detail", args=[upload.id])


class AgentUploadListView(AgentUploadActorMixin, UploadListView):
    pass


class AgentUploadDetailView(AgentUploadActorMixin, UploadDetailView):
    pass


class ArtifactUploadView(AgentView):
    """Where an agent sends an engine: a presigned PUT with S3 (the server never receives the bytes), else the resumable uploads."""

    @extend_schema(request=ArtifactUploadPlanSerializer, responses={200: ArtifactUploadPlanAnswerSerializer})
    def post(self, request, task_id: int):
        data = ArtifactUploadPlanSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        plan = artifact_uploads.device_task_artifact_upload_plan(agent=self.agent, task_id=task_id, **data.validated_data)
        return Response(plan)


class ArtifactView(AgentView):
    parser_classes = [MultiPartParser, BoundedJSONParser]

    @extend_schema(request=ArtifactUploadSerializer, responses={201: ArtifactStoredSerializer})
    def post(self, request, task_id: int):
        data = ArtifactUploadSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        if "staged" in values:
            artifact = artifact_uploads.device_task_store_staged_artifact(
                agent=self.agent, task_id=task_id, attempt=values["attempt"], staged=values["staged"], filename=values.get("filename") or "",
            )
            return Response({"sha256": artifact.blob.sha256, "artifact": artifact.id}, status=status.HTTP_201_CREATED)
        if "upload" in values:
            artifact = services.device_task_store_uploaded_artifact(
                agent=self.agent, task_id=task_id, attempt=values["attempt"], upload_id=values["upload"], filename=values.get("filename") or "",
            )
        else:
            upload = values["file"]
            storage_quota_check(organization=self.agent.organization, adding_bytes=upload.size, what="This engine")
            artifact = services.device_task_store_artifact(
                agent=self.agent, task_id=task_id, attempt=values["attempt"], path=Path(upload.temporary_file_path()),
                filename=values.get("filename") or upload.name,
            )
        return Response({"sha256": artifact.blob.sha256, "artifact": artifact.id}, status=status.HTTP_201_CREATED)


class ResultView(AgentView):
    parser_classes = [AgentResultJSONParser]

    @extend_schema(request=ResultSerializer, responses={200: ResultAnswerSerializer})
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
            support=values.get("support") or {},
        )
        return Response({"ok": True})


RETIME_FILE_PREFIX = "retime-"


def _retimed_blob(task, name: str):
    """The model of one variant a RETIME task re-times (`retime-<task id>`); None for anything else."""
    wanted = name.removeprefix(RETIME_FILE_PREFIX)
    other = next((t for t in retimed_tasks(task) if str(t.id) == wanted), None) if wanted.isdigit() else None
    return other.variant.artifact.blob if other is not None and other.variant.artifact else None


class TaskFileView(AgentView):
    FILES = {"model", "validation", "reference"}

    @extend_schema(responses={(200, "application/octet-stream"): bytes})
    def get(self, request, task_id: int, name: str):
        if name not in self.FILES and not name.startswith(RETIME_FILE_PREFIX):
            raise KilnError("Not found.", code="not_found", status_code=404)
        task = services.device_task_for_agent(agent=self.agent, task_id=task_id, attempt=None)
        if task.status != DeviceTaskStatus.LEASED:
            raise KilnError("The task is no longer leased.", code="not_leased", status_code=409)
        if name.startswith(RETIME_FILE_PREFIX):
            blob = _retimed_blob(task, name) if task.purpose == DeviceTaskPurpose.RETIME else None
            if blob is None:
                raise KilnError("Not found.", code="not_found", status_code=404)
            return download_response(blob, f"task{task.id}-{name}.onnx")
        blob = {"model": task.variant.artifact.blob if task.variant.artifact else None, "validation": task.job.validation_blob, "reference": task.job.reference_blob}[name]
        if blob is None:
            raise KilnError("Not found.", code="not_found", status_code=404)
        return download_response(blob, f"task{task.id}-{name}{'.onnx' if name == 'model' else '.npz'}")
