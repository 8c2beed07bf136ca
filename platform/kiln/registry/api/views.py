"""Models, versions and datasets: upload, list, inspect, download."""
from __future__ import annotations

import re

from django.conf import settings
from django.http import FileResponse, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.parsers import MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from kiln.core.errors import KilnError
from kiln.core.parsers import BoundedJSONParser

from .. import selectors, services, storage
from ..uploads import parse_metadata
from .serializers import (
    DatasetPreviewSerializer,
    DatasetSerializer,
    DatasetUploadSerializer,
    ModelCreatedSerializer,
    ModelSerializer,
    ModelUploadSerializer,
    ModelVersionCreatedSerializer,
    ModelVersionSerializer,
    OutputKindsSerializer,
    RawPreviewSerializer,
    RecipeProposalSerializer,
    StorageSerializer,
    UploadSerializer,
    VersionUploadSerializer,
)


class StreamingUploadMixin:
    """A file either in a multipart body (streamed through HashingUploadHandler, see settings) or
    as the id of a finished resumable upload in a JSON body (`{"upload": "<id>", ...}`)."""

    parser_classes = [MultiPartParser, BoundedJSONParser]

    def parsed_upload(self, request, serializer_class):
        data = serializer_class(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        upload_id = values.pop("upload", None)
        if "file" in values:
            # A resumable upload was counted against the quota when it began; a multipart body is counted now.
            services.storage_quota_check(organization=request.organization, adding_bytes=values["file"].size, what="This upload")
        if upload_id is not None:
            upload = selectors.upload_get(organization=request.organization, owner=f"user:{request.user.id}", upload_id=upload_id)
            values["file"] = services.upload_consume(upload=upload)
        return values


def download_response(blob, filename: str) -> HttpResponse:
    """A blob as a download: a redirect to a short-lived presigned URL with S3, else streamed from the folder.

    Callers check first that the requester may read the blob (its organization, the agent's lease).
    """
    url = storage.presigned_download_url(blob.sha256, filename=filename)
    if url is not None:
        return HttpResponseRedirect(url)
    path = storage.local_path(blob.sha256)
    if not path.exists():
        raise KilnError("The file of this object is missing from storage.", code="missing_blob", status_code=410)
    return FileResponse(open(path, "rb"), as_attachment=True, filename=filename)


class ModelListView(StreamingUploadMixin, generics.ListAPIView):
    serializer_class = ModelSerializer

    def get_queryset(self):
        return selectors.model_list(organization=self.request.organization, search=self.request.query_params.get("search", ""))

    @extend_schema(request=ModelUploadSerializer, responses={201: ModelCreatedSerializer})
    def post(self, request):
        data = self.parsed_upload(request, ModelUploadSerializer)
        with services.upload_released_on_error(upload=data["file"]):
            model = services.model_create(
                organization=request.organization, user=request.user, name=data.get("name", ""), upload=data["file"]
            )
        model = selectors.model_get(organization=request.organization, model_id=model.id)
        return Response({**ModelSerializer(model).data, "identical_to": selectors.model_versions_identical(version=model.versions.get())},
                        status=status.HTTP_201_CREATED)


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

    @extend_schema(request=VersionUploadSerializer, responses={201: ModelVersionCreatedSerializer})
    def post(self, request, pk: int):
        model = selectors.model_get(organization=request.organization, model_id=pk)
        data = self.parsed_upload(request, VersionUploadSerializer)
        with services.upload_released_on_error(upload=data["file"]):
            version = services.model_version_create(model=model, upload=data["file"])
        return Response({**ModelVersionSerializer(version).data, "identical_to": selectors.model_versions_identical(version=version)},
                        status=status.HTTP_201_CREATED)


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

    @extend_schema(responses={204: None})
    def delete(self, request, pk: int, number: int):
        """Delete this version and the stored file nothing else uses (409 while jobs use it, or when it is the last one)."""
        services.model_version_delete(version=_version(request, pk, number))
        return Response(status=status.HTTP_204_NO_CONTENT)


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
        return download_response(version.blob, version.filename)


class DatasetListView(StreamingUploadMixin, generics.ListAPIView):
    serializer_class = DatasetSerializer

    def get_queryset(self):
        return selectors.dataset_list(organization=self.request.organization)

    @extend_schema(request=DatasetUploadSerializer, responses={201: DatasetSerializer})
    def post(self, request):
        data = self.parsed_upload(request, DatasetUploadSerializer)
        with services.upload_released_on_error(upload=data["file"]):
            dataset = services.dataset_create(
                organization=request.organization, user=request.user, name=data.get("name", ""), kind=data["kind"], upload=data["file"],
                recipe=data.get("recipe") or None, tokenizer=data.get("tokenizer"),
            )
        return Response(DatasetSerializer(dataset).data, status=status.HTTP_201_CREATED)


class DatasetPreviewView(StreamingUploadMixin, APIView):
    """What a recipe makes of the first files of a zip (tensors, thumbnails, labels), checked against a model; nothing is stored."""

    @extend_schema(request=DatasetPreviewSerializer, responses={200: RawPreviewSerializer})
    def post(self, request):
        data = self.parsed_upload(request, DatasetPreviewSerializer)
        version = None
        if data.get("model_version"):
            version = selectors.model_version_get(organization=request.organization, version_id=data["model_version"])
        with services.upload_released_on_error(upload=data["file"]):
            names = data["names"].splitlines() if data.get("names") else None
            return Response(services.dataset_preview(organization=request.organization, upload=data["file"], recipe=data["recipe"],
                                                     version=version, names=names))


class ModelVersionRecipeView(APIView):
    """The preprocessing recipe Kiln proposes for raw data (images, WAV files, text) fed to this version, with its reasons."""

    @extend_schema(responses={200: RecipeProposalSerializer})
    def get(self, request, pk: int, number: int):
        return Response(selectors.model_version_recipe(version=_version(request, pk, number)))


class DatasetDetailView(APIView):
    @extend_schema(responses={200: DatasetSerializer})
    def get(self, request, pk: int):
        return Response(DatasetSerializer(selectors.dataset_get(organization=request.organization, dataset_id=pk)).data)

    @extend_schema(responses={204: None})
    def delete(self, request, pk: int):
        services.dataset_delete(dataset=selectors.dataset_get(organization=request.organization, dataset_id=pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class StorageView(APIView):
    """What the organization stores against its quota (KILN_STORAGE_QUOTA_BYTES)."""

    @extend_schema(responses={200: StorageSerializer})
    def get(self, request):
        return Response(selectors.organization_storage(organization=request.organization))


# -- resumable uploads (tus 1.0.0: core, creation, termination) -------------------------------

TUS_HEADERS = {"Tus-Resumable": "1.0.0"}


class UploadActorMixin:
    """Who acts on uploads: a member of the request's organization (the agent API overrides this)."""

    def actor(self, request) -> tuple[object, str]:
        return request.organization, f"user:{request.user.id}"

    def upload_url(self, upload) -> str:
        return reverse("upload-detail", args=[upload.id])

    def finalize_response(self, request, response, *args, **kwargs):
        for header, value in TUS_HEADERS.items():
            response[header] = value
        return super().finalize_response(request, response, *args, **kwargs)


def upload_json(upload, url: str) -> dict:
    return {"id": str(upload.id), "url": url, "filename": upload.filename, "length": upload.length, "offset": upload.offset,
            "complete": upload.complete, "sha256": upload.blob.sha256 if upload.blob_id else None, "expires_at": upload.expires_at}


# A byte count as HTTP writes one: ASCII digits only. Python's int() also takes "1_0", " 10", "+10"
# and other scripts' digits ("١٠"), which a proxy in front would read differently.
BYTE_COUNT = re.compile(r"[0-9]{1,19}")


def _byte_count(raw: str, name: str) -> int:
    if not BYTE_COUNT.fullmatch(raw or ""):
        raise KilnError(f"The {name} header must be a byte count (digits 0-9 only), not {raw[:40]!r}.", code="invalid_header")
    return int(raw)


def _header_int(request, name: str) -> int:
    return _byte_count(request.META.get("HTTP_" + name.upper().replace("-", "_"), ""), name)


class UploadListView(UploadActorMixin, APIView):
    @extend_schema(request=None, responses={201: UploadSerializer})
    def post(self, request):
        organization, owner = self.actor(request)
        metadata = parse_metadata(request.META.get("HTTP_UPLOAD_METADATA", ""))
        upload = services.upload_create(organization=organization, owner=owner, length=_header_int(request, "Upload-Length"), metadata=metadata)
        url = self.upload_url(upload)
        response = Response(upload_json(upload, url), status=status.HTTP_201_CREATED)
        response["Location"] = url
        response["Upload-Offset"] = "0"
        return response

    def options(self, request, *args, **kwargs):
        response = Response(status=status.HTTP_204_NO_CONTENT)
        response["Tus-Version"] = "1.0.0"
        response["Tus-Extension"] = "creation,termination"
        response["Tus-Max-Size"] = str(settings.MAX_UPLOAD_BYTES)
        return response


class UploadDetailView(UploadActorMixin, APIView):
    def _upload(self, request, upload_id):
        organization, owner = self.actor(request)
        return selectors.upload_get(organization=organization, owner=owner, upload_id=upload_id)

    def _offset_response(self, upload, status_code: int) -> Response:
        response = Response(status=status_code)
        response["Upload-Offset"] = str(upload.offset)
        response["Upload-Length"] = str(upload.length)
        response["Cache-Control"] = "no-store"
        return response

    @extend_schema(responses={200: UploadSerializer})
    def get(self, request, upload_id):
        upload = self._upload(request, upload_id)
        response = Response(upload_json(upload, self.upload_url(upload)))
        response["Upload-Offset"] = str(upload.offset)
        return response

    def head(self, request, upload_id):
        return self._offset_response(self._upload(request, upload_id), status.HTTP_200_OK)

    @extend_schema(request=None, responses={204: None})
    def patch(self, request, upload_id):
        upload = self._upload(request, upload_id)
        if request.content_type.split(";")[0].strip() != "application/offset+octet-stream":
            raise KilnError("A chunk is sent as application/offset+octet-stream.", code="unsupported_media_type", status_code=415)
        raw_length = request.META.get("CONTENT_LENGTH") or ""
        if not raw_length:
            raise KilnError("A chunk needs a Content-Length.", code="length_required", status_code=411)
        length = _byte_count(raw_length, "Content-Length")
        # Read from the raw request: DRF's parsers would buffer the chunk in memory.
        upload = services.upload_append(upload=upload, offset=_header_int(request, "Upload-Offset"), stream=request._request, length=length)
        return self._offset_response(upload, status.HTTP_204_NO_CONTENT)

    @extend_schema(responses={204: None})
    def delete(self, request, upload_id):
        services.upload_delete(upload=self._upload(request, upload_id))
        return Response(status=status.HTTP_204_NO_CONTENT)
