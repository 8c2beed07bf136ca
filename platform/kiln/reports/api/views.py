from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from kiln.pipeline.selectors import job_get

from ..selectors import job_report


class JobReportView(APIView):
    @extend_schema(responses={200: dict})
    def get(self, request, pk: int):
        return Response(job_report(job=job_get(organization=request.organization, job_id=pk)))
