"""Reads for jobs, variants, device tasks and artifacts, scoped to one organization."""
from __future__ import annotations

from django.shortcuts import get_object_or_404

from .models import Artifact, DeploymentJob


def job_list(*, organization):
    return DeploymentJob.objects.filter(organization=organization).select_related("model_version__model")


def job_get(*, organization, job_id: int) -> DeploymentJob:
    queryset = DeploymentJob.objects.select_related("model_version__model").prefetch_related(
        "events", "variants__artifact__blob", "device_tasks__leased_by", "device_tasks__variant"
    )
    return get_object_or_404(queryset, organization=organization, pk=job_id)


def job_artifacts(*, job: DeploymentJob):
    return job.artifacts.select_related("blob").order_by("id")


def artifact_get(*, organization, artifact_id: int) -> Artifact:
    return get_object_or_404(Artifact.objects.select_related("blob"), organization=organization, pk=artifact_id)
