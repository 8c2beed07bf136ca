"""A job's outcome per device, as lists show it: read from its reports' decisions only.

Light on purpose (models only): kiln.pipeline.selectors builds its job queries with it.
"""
from __future__ import annotations

from django.db.models import Prefetch
from django.db.models.fields.json import KeyTransform

from .models import Report

# The parts of a stored decision (workers/scoring.py `decide`) a list shows; the rest (every alternative, every round) stays unread.
OUTCOME_KEYS = ("label", "effective_precision", "short", "comparison", "tie", "accuracy", "text", "speedup", "provisional")


def _decision_key(name: str) -> KeyTransform:
    return KeyTransform(name, KeyTransform("decision", KeyTransform("recommendation", "data")))


def job_outcome_reports() -> Prefetch:
    """A job's reports as `job_outcome` reads them, for prefetch_related, in one query: each with its agent's name and,
    of its data, only the decision's headline fields (the data holds every variant's measurements: decoding them was
    most of the cost of a page of jobs). Reports stored before decisions existed bring their verdict instead."""
    reports = Report.objects.select_related("agent").only("job", "target", "reason", "agent__name")
    fields = {f"outcome_{name}": _decision_key(name) for name in OUTCOME_KEYS}
    return Prefetch("reports", queryset=reports.annotate(**fields, outcome_verdict=KeyTransform("verdict", KeyTransform("recommendation", "data"))))


def _headline(report) -> dict:
    if report.outcome_label is not None or report.outcome_text is not None:
        return {name: getattr(report, f"outcome_{name}") for name in OUTCOME_KEYS}
    verdict = report.outcome_verdict or {}
    speedup = verdict.get("speedup") or {}
    comparison = "faster" if speedup.get("beyond_noise") else ("tie" if speedup else None)
    return {"label": verdict.get("label"), "effective_precision": verdict.get("effective_precision"), "short": None, "comparison": comparison,
            "tie": verdict.get("tie", False), "accuracy": verdict.get("accuracy"), "text": verdict.get("text"), "speedup": speedup, "provisional": None}


def job_outcome(*, job) -> list[dict]:
    """Per device of a finished job: the recommended variant, its speed-up over FP32 as the decision states it, and its
    accuracy (for lists). The job's reports are prefetched with `job_outcome_reports()`."""
    outcome = []
    for report in job.reports.all():
        headline = _headline(report)
        speedup = headline["speedup"] or {}
        outcome.append({
            "device": report.agent.name if report.agent else report.target, "agent": report.agent_id,
            # `precision`: what the recommended variant runs in (its effective precision: bf16 for an FP32 build under a bf16 hint).
            "recommended": headline["label"], "precision": headline["effective_precision"], "speedup": speedup.get("ratio"),
            "comparison": headline["comparison"], "provisional": bool(headline["provisional"]),
            "speedup_text": headline["short"], "beyond_noise": headline["comparison"] == "faster" if speedup else None,
            "tie": bool(headline["tie"]), "accuracy": headline["accuracy"], "verdict": headline["text"] or report.reason,
        })
    return sorted(outcome, key=lambda row: row["device"] or "")
