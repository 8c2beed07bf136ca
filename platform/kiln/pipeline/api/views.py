"""Deployment jobs: create, list, detail, cancel, artifacts, downloads."""
from __future__ import annotations

import asyncio
import json
import time

from django.core.handlers.asgi import ASGIRequest
from django.core.serializers.json import DjangoJSONEncoder
from django.http import StreamingHttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from kiln.core.db import run_in_db_thread
from kiln.registry.api.views import download_response
from kiln.registry.selectors import dataset_get, model_version_get

from .. import selectors, services
from .serializers import ArtifactSerializer, JobCreateSerializer, JobListSerializer, JobSerializer


class JobListView(generics.ListAPIView):
    serializer_class = JobListSerializer

    def get_queryset(self):
        return selectors.job_list(organization=self.request.organization, model_id=self.request.query_params.get("model"))

    @extend_schema(request=JobCreateSerializer, responses={201: JobSerializer})
    def post(self, request):
        data = JobCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        organization = request.organization
        job = services.job_create(
            organization=organization,
            user=request.user,
            model_version=model_version_get(organization=organization, version_id=values["model_version"]),
            precisions=values["precisions"],
            calibration_dataset=dataset_get(organization=organization, dataset_id=values["calibration_dataset"]) if values["calibration_dataset"] else None,
            validation_dataset=dataset_get(organization=organization, dataset_id=values["validation_dataset"]) if values["validation_dataset"] else None,
            targets=values["targets"],
            tolerance=values["tolerance"],
            package=values["package"],
            metrics=values["metrics"],
            state=values["state"],
            initial_state=values["initial_state"],
            calibration_subset=values["calibration_subset"],
            budget_minutes=values["budget_minutes"],
        )
        return Response(JobSerializer(selectors.job_get(organization=organization, job_id=job.id)).data, status=status.HTTP_201_CREATED)


class JobDetailView(APIView):
    @extend_schema(responses={200: JobSerializer})
    def get(self, request, pk: int):
        return Response(JobSerializer(selectors.job_get(organization=request.organization, job_id=pk)).data)


class JobCancelView(APIView):
    @extend_schema(request=None, responses={200: JobSerializer})
    def post(self, request, pk: int):
        job = services.job_cancel(job=selectors.job_get(organization=request.organization, job_id=pk))
        return Response(JobSerializer(selectors.job_get(organization=request.organization, job_id=job.id)).data)


class JobRerunView(APIView):
    @extend_schema(request=None, responses={201: JobSerializer})
    def post(self, request, pk: int):
        job = services.job_rerun(job=selectors.job_get(organization=request.organization, job_id=pk), user=request.user)
        return Response(JobSerializer(selectors.job_get(organization=request.organization, job_id=job.id)).data, status=status.HTTP_201_CREATED)


class JobArtifactsView(APIView):
    @extend_schema(responses={200: ArtifactSerializer(many=True)})
    def get(self, request, pk: int):
        job = selectors.job_get(organization=request.organization, job_id=pk)
        return Response(ArtifactSerializer(selectors.job_artifacts(job=job), many=True).data)


class ArtifactDownloadView(APIView):
    @extend_schema(responses={(200, "application/octet-stream"): bytes})
    def get(self, request, pk: int):
        artifact = selectors.artifact_get(organization=request.organization, artifact_id=pk)
        return download_response(artifact.blob, artifact.name)


STREAM_POLL_SECONDS = 1.0
STREAM_KEEPALIVE_SECONDS = 15.0
# A stream ends after this long and the browser's EventSource reconnects: no connection lives forever.
STREAM_MAX_SECONDS = 300.0


class _JobStream:
    """What one job's event stream sends next; the same for the sync (WSGI) and async (ASGI) server."""

    def __init__(self, *, organization, job_id: int, max_s: float):
        self.organization, self.job_id, self.max_s = organization, job_id, max_s
        self.started = self.last_sent = time.monotonic()
        self.fingerprint = None
        self.done = False

    def poll(self) -> list[str]:
        """The chunks to send now (reads the database); sets `done` when the stream should end."""
        chunks = []
        current = selectors.job_change_fingerprint(job_id=self.job_id)
        if current != self.fingerprint:
            self.fingerprint = current
            job = selectors.job_get(organization=self.organization, job_id=self.job_id)
            chunks.append(f"event: job\ndata: {json.dumps(JobSerializer(job).data, cls=DjangoJSONEncoder)}\n\n")
            self.last_sent = time.monotonic()
            if job.is_terminal:
                self.done = True
                return chunks
        now = time.monotonic()
        if now - self.started > self.max_s:
            self.done = True
        elif now - self.last_sent > STREAM_KEEPALIVE_SECONDS:
            chunks.append(": keep-alive\n\n")
            self.last_sent = now
        return chunks


def job_event_stream(*, organization, job_id: int, poll_s: float = STREAM_POLL_SECONDS, max_s: float = STREAM_MAX_SECONDS):
    """Server-sent events: the job (as GET jobs/{id}/ answers) each time it changes, until it ends."""
    stream = _JobStream(organization=organization, job_id=job_id, max_s=max_s)
    yield "retry: 2000\n\n"
    while True:
        yield from stream.poll()
        if stream.done:
            return
        time.sleep(poll_s)


async def job_event_stream_async(*, organization, job_id: int, poll_s: float = STREAM_POLL_SECONDS, max_s: float = STREAM_MAX_SECONDS):
    """The same stream for the ASGI server: it sleeps on the event loop, holding no thread between reads."""
    stream = _JobStream(organization=organization, job_id=job_id, max_s=max_s)
    yield "retry: 2000\n\n"
    while True:
        for chunk in await run_in_db_thread(stream.poll):
            yield chunk
        if stream.done:
            return
        await asyncio.sleep(poll_s)


class EventStreamRenderer(BaseRenderer):
    """Lets `Accept: text/event-stream` (what EventSource sends) through content negotiation; errors are
    rendered as JSON by JobStreamView, never under this media type."""

    media_type = "text/event-stream"
    format = "event-stream"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return json.dumps(data, cls=DjangoJSONEncoder).encode()


class JobStreamView(APIView):
    """`text/event-stream` of job updates, for the job page instead of polling."""

    renderer_classes = [EventStreamRenderer, JSONRenderer]

    def finalize_response(self, request, response, *args, **kwargs):
        # An error (404, 401, 429...) is a JSON body and says so, whatever the client accepts.
        if isinstance(response, Response) and response.status_code >= 400:
            request.accepted_renderer, request.accepted_media_type = JSONRenderer(), JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)

    @extend_schema(responses={(200, "text/event-stream"): str})
    def get(self, request, pk: int):
        job = selectors.job_get(organization=request.organization, job_id=pk)
        # Django buffers a sync iterator whole under ASGI (and an async one under WSGI): pick the server's kind.
        events = job_event_stream_async if isinstance(request._request, ASGIRequest) else job_event_stream
        response = StreamingHttpResponse(events(organization=request.organization, job_id=job.id), content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response
