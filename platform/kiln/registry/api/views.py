"""Models, versions and datasets: upload, list, inspect, download."""
from __future__ import annotations

from django.http import FileResponse
from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.parsers import MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from kiln.core.errors import KilnError

from .. import selectors, services
from .serializers import (
    DatasetSerializer,
    DatasetUploadSerializer,
    ModelSerializer,
    ModelUploadSerializer,
    ModelVersionSerializer,
    OutputKindsSerializer,
    VersionUploadSerializer,
)


class StreamingUploadMixin:
    """Multipart uploads: the body streams through HashingUploadHandler (see settings)."""

    parser_classes = [MultiPartParser]

    def parsed_upload(self, request, serializer_class):
        data = serializer_class(data=request.data)
        data.is_valid(raise_exception=True)
        return data.validated_data


def download_response(path, filename: str) -> FileResponse:
    if not path.exists():
        raise KilnError("The file of this object is missing from storage.", code="missing_blob", status_code=410)
    return FileResponse(open(path, "rb"), as_attachment=True, filename=filename)


class ModelListView(StreamingUploadMixin, generics.ListAPIView):
    serializer_class = ModelSerializer

    def get_queryset(self):
        return selectors.model_list(organization=self.request.organization, search=self.request.query_params.get("search", ""))

    @extend_schema(request=ModelUploadSerializer, responses={201: ModelSerializer})
    def post(self, request):
        data = self.parsed_upload(request, ModelUploadSerializer)
        model = services.model_create(
            organization=request.organization, user=request.user, name=data.get("name", ""), upload=data["file"]
        )
        model = selectors.model_get(organization=request.organization, model_id=model.id)
        return Response(ModelSerializer(model).data, status=status.HTTP_201_CREATED)


class ModelDetailView(APIView):
    @extend_schema(responses={200: ModelSerializer})
    def get(self, request, pk: int):
        return Response(ModelSerializer(selectors.model_get(organization=request.organization, model_id=pk)).data)

    @extend_schema(responses={204: None})
    def delete(self, request, pk: int):
        services.model_delete(model=selectors.model_get(organization=request.organization, model_id=pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class ModelVersionListView(StreamingUploadMixin, APIView):
    @extend_schema(responses={200: ModelVersionSerializer(many=True)})
    def get(self, request, pk: int):
        model = selectors.model_get(organization=request.organization, model_id=pk)
        return Response(ModelVersionSerializer(model.versions.all(), many=True).data)

    @extend_schema(request=VersionUploadSerializer, responses={201: ModelVersionSerializer})
    def post(self, request, pk: int):
        model = selectors.model_get(organization=request.organization, model_id=pk)
        data = self.parsed_upload(request, VersionUploadSerializer)
        version = services.model_version_create(model=model, upload=data["file"])
        return Response(ModelVersionSerializer(version).data, status=status.HTTP_201_CREATED)


class ModelVersionDetailView(APIView):
    @extend_schema(responses={200: ModelVersionSerializer})
    def get(self, request, pk: int, number: int):
        return Response(ModelVersionSerializer(_version(request, pk, number)).data)

    @extend_schema(request=OutputKindsSerializer, responses={200: ModelVersionSerializer})
    def patch(self, request, pk: int, number: int):
        """Override the kind Kiln inferred for some outputs; null restores the inferred kind."""
        data = OutputKindsSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        version = services.model_version_set_output_kinds(version=_version(request, pk, number), overrides=data.validated_data["output_kinds"])
        return Response(ModelVersionSerializer(version).data)


def _version(request, pk: int, number: int):
    model = selectors.model_get(organization=request.organization, model_id=pk)
    version = model.versions.filter(number=number).select_related("blob").first()
    if version is None:
        raise KilnError("Not found.", code="not_found", status_code=404)
    return version


class ModelVersionDownloadView(APIView):
    @extend_schema(responses={(200, "application/octet-stream"): bytes})
    def get(self, request, pk: int, number: int):
        model = selectors.model_get(organization=request.organization, model_id=pk)
        version = model.versions.filter(number=number).select_related("blob").first()
        if version is None:
            raise KilnError("Not found.", code="not_found", status_code=404)
        return download_response(selectors.blob_file(version.blob), version.filename)


class DatasetListView(StreamingUploadMixin, generics.ListAPIView):
    serializer_class = DatasetSerializer

    def get_queryset(self):
        return selectors.dataset_list(organization=self.request.organization)

    @extend_schema(request=DatasetUploadSerializer, responses={201: DatasetSerializer})
    def post(self, request):
        data = self.parsed_upload(request, DatasetUploadSerializer)
        dataset = services.dataset_create(
            organization=request.organization,
            user=request.user,
            name=data.get("name", ""),
            kind=data["kind"],
            upload=data["file"],
        )
        return Response(DatasetSerializer(dataset).data, status=status.HTTP_201_CREATED)


class DatasetDetailView(APIView):
    @extend_schema(responses={200: DatasetSerializer})
    def get(self, request, pk: int):
        return Response(DatasetSerializer(selectors.dataset_get(organization=request.organization, dataset_id=pk)).data)

    @extend_schema(responses={204: None})
    def delete(self, request, pk: int):
        services.dataset_delete(dataset=selectors.dataset_get(organization=request.organization, dataset_id=pk))
        return Response(status=status.HTTP_204_NO_CONTENT)
