"""Reads for reports: the report document of a job."""
from __future__ import annotations

from .models import Report


def _agent_json(report: Report) -> dict | None:
    agent = report.agent
    if agent is None:
        return None
    return {"id": agent.id, "name": agent.name, "capabilities": agent.capabilities, "labels": agent.labels}


def job_report(*, job) -> dict:
    reports = Report.objects.filter(job=job).select_related("agent")
    return {
        "job": job.id,
        "status": job.status,
        "tolerance": job.tolerance,
        "search": {"rounds": job.search.get("round", 1), "sensitivity": job.search.get("sensitivity") or []},
        "devices": [
            {
                "agent": _agent_json(report),
                "target": report.target,
                "variants": report.data.get("variants", []),
                "recommended": report.recommended_task_id,
                "reason": report.reason,
            }
            for report in reports
        ],
    }
