"""Deployment jobs: create, list, detail, cancel, artifacts, downloads."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.response import Response
from rest_framework.views import APIView

from kiln.registry.api.views import download_response
from kiln.registry.selectors import blob_file, dataset_get, model_version_get

from .. import selectors, services
from .serializers import ArtifactSerializer, JobCreateSerializer, JobListSerializer, JobSerializer


class JobListView(generics.ListAPIView):
    serializer_class = JobListSerializer

    def get_queryset(self):
        return selectors.job_list(organization=self.request.organization)

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
            metrics=values["metrics"],
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


class JobArtifactsView(APIView):
    @extend_schema(responses={200: ArtifactSerializer(many=True)})
    def get(self, request, pk: int):
        job = selectors.job_get(organization=request.organization, job_id=pk)
        return Response(ArtifactSerializer(selectors.job_artifacts(job=job), many=True).data)


class ArtifactDownloadView(APIView):
    @extend_schema(responses={(200, "application/octet-stream"): bytes})
    def get(self, request, pk: int):
        artifact = selectors.artifact_get(organization=request.organization, artifact_id=pk)
        return download_response(blob_file(artifact.blob), artifact.name)
