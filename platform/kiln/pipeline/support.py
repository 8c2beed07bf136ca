"""The `support` stage: before anything is built, each runtime the job's devices offer says which of the model's
operators it runs (devices/support.py). A backend that cannot run the model is skipped for the job, with the
runtime's reason; the job goes on with the others, and fails here only when none is left.

This module owns that decision: `runnable_backends` is what planning and dispatch ask.
"""
from __future__ import annotations

from kiln.fleet.selectors import targets_resolve
from kiln.registry.services import model_version_support_record
from kiln_contract import operator_support
from workers.support import SupportCheckFailed, check_isolated

from .models import DeploymentJob
from .queue import enqueue_stage
from .runner import StageFailed, model_folder, run_stage, working_model_path
from .services import job_event_add

# Asked when no agent is known yet (a job waiting for its first device): every backend an agent may bring.
DEFAULT_BACKENDS = ("onnxruntime", "openvino")


def skipped_backends(job: DeploymentJob) -> dict[str, str]:
    """Backend -> the runtime's reason, for the backends this job skips."""
    return dict((job.support or {}).get("skipped") or {})


def runnable_backends(job: DeploymentJob, backends) -> set[str]:
    """Of `backends`, those this job may build and measure (the support stage skipped none of them)."""
    return set(backends) - set(skipped_backends(job))


def _offered_backends(job: DeploymentJob) -> list[str]:
    targets, _ = targets_resolve(job=job)
    agents = [t.pinned_agent for t in targets if t.pinned_agent] or list(job.organization.agents.filter(revoked_at__isnull=True))
    offered = set().union(*(set(agent.backends) for agent in agents)) if agents else set()
    return sorted(offered or DEFAULT_BACKENDS)


def _support(job: DeploymentJob) -> str:
    model_path = working_model_path(job)
    try:
        answers = check_isolated(model_path, _offered_backends(job), folder=model_folder(job))
    except (SupportCheckFailed, OSError, ValueError) as exc:
        # The check is advice: without it the job goes on, and each device's own check still runs before it compiles.
        job_event_add(job=job, stage="support", level="warning", message=f"Operator support could not be checked: {exc}")
        return "not checked"
    skipped = {a["backend"]: a.get("reason") or operator_support.summary(a) for a in answers if not operator_support.runnable(a)}
    job.support = {"answers": answers, "skipped": skipped}
    job.save(update_fields=["support", "updated_at"])
    sha256 = (job.converted_blob or job.model_version.onnx_blob or job.model_version.blob).sha256
    model_version_support_record(version=job.model_version, answers=answers, where="server", sha256=sha256)
    for answer in answers:
        if operator_support.runnable(answer):
            job_event_add(job=job, stage="support", message=operator_support.summary(answer))
        else:
            job_event_add(job=job, stage="support", level="warning", message=f"{skipped[answer['backend']]} Skipped {answer['backend']} for this job.")
    if answers and len(skipped) == len(answers):
        raise StageFailed("No backend can run this model: " + " | ".join(skipped.values()))
    verdicts = ", ".join(f"{a['backend']} {a.get('version') or ''}: {a['verdict']}".replace("  ", " ") for a in answers)
    return verdicts or "no runtime answered"


def job_support(*, job_id: int) -> None:
    if run_stage(job_id, "support", _support):
        enqueue_stage(job_id=job_id, stage="reference")
