"""Reads for reports: the report document of a job."""
from __future__ import annotations

from django.urls import reverse

from .models import Report
from .scoring import fp32_noise


def _agent_json(agent) -> dict | None:
    if agent is None:
        return None
    return {"id": agent.id, "name": agent.name, "capabilities": agent.capabilities, "labels": agent.labels}


def device_json(*, agent, target: str, variants: list, recommended, reason: str, final: bool, package=None) -> dict:
    return {
        "agent": _agent_json(agent), "target": target, "variants": variants, "recommended": recommended, "reason": reason, "final": final,
        "fp32_noise": fp32_noise(variants),
        "package": {"id": package.id, "name": package.name, "download_url": reverse("artifact-download", args=[package.id])} if package else None,
    }


def job_report(*, job) -> dict:
    """The stored report of a finished job; while it runs, the results measured so far."""
    from kiln.pipeline.models import ArtifactKind

    from .packaging import package_name
    from .services import device_reports

    stored = list(Report.objects.filter(job=job).select_related("agent"))
    if stored:
        packages = {a.name: a for a in job.artifacts.filter(kind=ArtifactKind.PACKAGE)}
        devices = [
            device_json(agent=r.agent, target=r.target, variants=r.data.get("variants", []), recommended=r.recommended_task_id, reason=r.reason,
                        final=True, package=packages.get(package_name(r.target)))
            for r in stored
        ]
    else:
        live, _ = device_reports(job=job)
        devices = [
            device_json(agent=r.agent, target=r.target, variants=r.variants, recommended=r.recommended, reason=r.reason, final=False)
            for r in live
        ]
    return {
        "job": job.id,
        "status": job.status,
        "tolerance": job.tolerance,
        "metrics": job.metrics,
        "evaluation": job.evaluation,
        "search": {"rounds": job.search.get("round", 1), "sensitivity": job.search.get("sensitivity") or []},
        "devices": devices,
    }
