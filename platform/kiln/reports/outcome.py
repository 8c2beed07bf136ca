"""A job's outcome per device, as lists show it: read from its reports' verdicts only.

Light on purpose (models only): kiln.pipeline.selectors builds its job queries with it.
"""
from __future__ import annotations

from django.db.models import Prefetch
from django.db.models.fields.json import KeyTransform

from .models import Report


def job_outcome_reports() -> Prefetch:
    """A job's reports as `job_outcome` reads them, for prefetch_related, in one query: each with its
    agent's name and, of its data, only the verdict (the data holds every variant's measurements:
    decoding them was most of the cost of a page of jobs)."""
    reports = Report.objects.select_related("agent").only("job", "target", "reason", "agent__name")
    return Prefetch("reports", queryset=reports.annotate(outcome_verdict=KeyTransform("verdict", KeyTransform("recommendation", "data"))))


def job_outcome(*, job) -> list[dict]:
    """Per device of a finished job: the recommended variant, its speed-up over FP32 and its accuracy
    (for lists). The job's reports are prefetched with `job_outcome_reports()`."""
    outcome = []
    for report in job.reports.all():
        verdict = report.outcome_verdict or {}
        speedup = verdict.get("speedup") or {}
        # The gap the verdict could not settle: the speed-up over FP32, else the tie with a faster variant.
        unsettled = speedup or next(iter(verdict.get("tied_with") or []), {})
        outcome.append({
            "device": report.agent.name if report.agent else report.target, "agent": report.agent_id,
            "recommended": verdict.get("label"), "speedup": speedup.get("ratio"), "beyond_noise": speedup.get("beyond_noise"),
            "tie": verdict.get("tie", False), "too_noisy": bool(unsettled.get("too_noisy")), "accuracy": verdict.get("accuracy"),
            "verdict": verdict.get("text") or report.reason,
        })
    return sorted(outcome, key=lambda row: row["device"] or "")
