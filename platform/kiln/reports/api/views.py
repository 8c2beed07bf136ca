import base64

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics
from rest_framework.response import Response
from rest_framework.views import APIView

from kiln.accounts.permissions import IsOrganizationMemberNotViewer
from kiln.core.errors import KilnError
from kiln.pipeline.selectors import job_get
from kiln.registry.selectors import model_version_get

from .. import signing
from ..selectors import PERFORMANCE_FILTERS, job_report, model_version_estimates, performance_list
from .serializers import MeasurementSerializer, ModelEstimateSerializer, PackageKeySerializer, ReportSerializer, SigningKeySerializer


class JobReportView(APIView):
    """The report: per device, every variant measured and the one decision (while the job runs, what was measured so far)."""

    @extend_schema(responses={200: ReportSerializer})
    def get(self, request, pk: int):
        return Response(job_report(job=job_get(organization=request.organization, job_id=pk)))


class PerformanceListView(generics.ListAPIView):
    """Every measurement of the organization across jobs, devices and toolchain versions."""

    serializer_class = MeasurementSerializer

    @extend_schema(parameters=[OpenApiParameter(name, str) for name in [*PERFORMANCE_FILTERS, "regression", "ordering"]])
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def get_queryset(self):
        return performance_list(organization=self.request.organization, filters=self.request.query_params)


class PerformanceEstimateView(APIView):
    @extend_schema(parameters=[OpenApiParameter("model_version", int, required=True)], responses={200: ModelEstimateSerializer})
    def get(self, request):
        raw = request.query_params.get("model_version", "")
        if not raw.isdigit():
            raise KilnError("model_version (an id) is required.", code="invalid_filter")
        return Response(model_version_estimates(version=model_version_get(organization=request.organization, version_id=int(raw))))


class PackageSigningKeyView(APIView):
    """The public half of the key that signs deployment packages, to pin with `run.py --public-key`."""

    @extend_schema(responses={200: SigningKeySerializer})
    def get(self, request):
        return Response({"public_key_pem": signing.public_key_pem(), "fingerprint": signing.public_key_fingerprint(), "algorithm": "Ed25519"})


class PackageKeyView(APIView):
    """The organization's key for encrypted packages (members and owners, not viewers; made on first use)."""

    permission_classes = [IsOrganizationMemberNotViewer]

    @extend_schema(responses={200: PackageKeySerializer})
    def get(self, request):
        key, key_id = signing.organization_package_key(organization=request.organization)
        return Response({"key": base64.b64encode(key).decode(), "key_id": key_id, "algorithm": "AES-256-GCM"})
