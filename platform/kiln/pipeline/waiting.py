"""Why a job waits, and how many are ahead of it: the one answer the API, the job page, the CLI and events give.

Two sources. A worker notes what only it can see on the job's row (`job_wait_note`: its build paused while a device of
the host times, memory it waits for, a per-organization limit that sent its task back). The rest is read from the
queues at the moment of asking: work sent but not started (an offered, unclaimed work lease) waits for a slot of its
class, and device tasks wait for a device that serves jobs in turn (kiln.fleet.selectors.in_turn).
"""
from __future__ import annotations

from django.utils import timezone

from kiln.fleet.selectors import in_turn
from workers.routing import BUILD, CHECK, CONTROL, work_class_of

from .models import DeploymentJob, DeviceTask, DeviceTaskStatus, JobStatus, Variant, VariantStatus, WorkSlot
from .queue import STAGE_TASK_NAMES, stages_of_class, waiting_builds, waiting_stages
from .services import job_event_add

BUILDS_PAUSED = "builds_paused"
MEMORY = "memory"
ORGANIZATION_LIMIT = "organization_limit"
BUILD_SLOT = "build_slot"
CHECK_SLOT = "check_slot"
WORKER = "worker"
DEVICE_BUSY = "device_busy"
# Noted causes repeat at every timing window: said once as an event, then shown live only.
QUIET_CAUSES = (BUILDS_PAUSED,)
SLOT_CAUSES = {BUILD: BUILD_SLOT, CHECK: CHECK_SLOT, CONTROL: WORKER}
SLOT_NAMES = {BUILD: "a build slot", CHECK: "a check slot", CONTROL: "a worker"}


# -- what workers note ------------------------------------------------------------------------

def job_wait_note(*, job_id: int, cause: str, message: str) -> None:
    """A worker says why the job's work waits; a new cause is a job event (a repeated pause is said once a job)."""
    job = DeploymentJob.objects.filter(pk=job_id).only("id", "waiting", "stage").first()
    if job is None or (job.waiting or {}).get("cause") == cause and (job.waiting or {}).get("message") == message:
        return
    said = list((job.waiting or {}).get("said") or [])
    waiting = {"cause": cause, "message": message, "since": timezone.now().isoformat(), "said": said}
    if cause not in QUIET_CAUSES or cause not in said:
        job_event_add(job=job, stage=job.stage, message=f"Waiting: {message}.")
        waiting["said"] = sorted({*said, cause})
    DeploymentJob.objects.filter(pk=job_id).update(waiting=waiting)


def job_wait_clear(*, job_id: int, cause: str | None = None) -> None:
    """The work goes on: forget the noted cause (only `cause`, when given), keeping which causes were already said."""
    job = DeploymentJob.objects.filter(pk=job_id).only("id", "waiting").first()
    if job is None or not (job.waiting or {}).get("cause"):
        return
    if cause is not None and job.waiting.get("cause") != cause:
        return
    DeploymentJob.objects.filter(pk=job_id).update(waiting={"said": job.waiting.get("said") or []})


# -- what the queues say ----------------------------------------------------------------------

def _jobs_ahead(work_class: str, *, job: DeploymentJob, offered_before) -> int:
    """Other jobs (of any organization: counted, never named) with work of the class sent before this job's."""
    ahead = set(waiting_stages(work_class).filter(stage_offered_at__lt=offered_before).exclude(pk=job.pk).values_list("pk", flat=True))
    if work_class == BUILD:
        ahead |= set(waiting_builds().filter(build_offered_at__lt=offered_before).exclude(job_id=job.pk)
                     .values_list("job_id", flat=True).distinct())
    return len(ahead)


def class_busy(work_class: str) -> bool:
    """Whether workers of the class are at work now (a claimed, live lease or slot): work of the class sent and not yet
    started is then waiting its turn, not lost."""
    now = timezone.now()
    stages = stages_of_class(work_class)
    if WorkSlot.objects.filter(work_class=work_class, expires_at__gt=now).exists():
        return True
    if DeploymentJob.objects.filter(stage_task__in=stages, stage_lease_expires_at__gt=now).exclude(stage_lease_owner="").exists():
        return True
    return work_class == BUILD and Variant.objects.filter(build_lease_expires_at__gt=now).exclude(build_lease_owner="").exists()


def _slot_wait(job: DeploymentJob) -> dict | None:
    """The job's next step was sent and no worker of its class has started it."""
    if (job.stage_task and not job.stage_lease_owner and job.stage_offered_at and job.stage_lease_expires_at
            and job.stage_lease_expires_at > timezone.now()):
        work_class = work_class_of(STAGE_TASK_NAMES.get(job.stage_task, ""))
        return _slot_answer(job, work_class, offered=job.stage_offered_at, what=f"the {job.stage_task} step")
    if job.stage != "quantize":
        return None
    builds = Variant.objects.filter(job=job, status__in=[VariantStatus.PENDING, VariantStatus.BUILDING])
    if builds.filter(status=VariantStatus.BUILDING).exists():
        return None
    first = waiting_builds().filter(job=job, build_offered_at__isnull=False).order_by("build_offered_at").values_list(
        "build_offered_at", flat=True).first()
    if first is None:
        return None
    count = builds.count()
    return _slot_answer(job, BUILD, offered=first, what=f"{count} build{'s' if count != 1 else ''}")


def _slot_answer(job: DeploymentJob, work_class: str, *, offered, what: str) -> dict:
    ahead = _jobs_ahead(work_class, job=job, offered_before=offered)
    since = offered
    message = f"waiting for {SLOT_NAMES[work_class]}: {ahead} job{'s' if ahead != 1 else ''} ahead ({what})"
    return {"cause": SLOT_CAUSES[work_class], "position": ahead, "since": since.isoformat() if since else None, "message": message}


def _device_wait(job: DeploymentJob) -> dict | None:
    """The job's device tasks wait while their device runs another job's: how many turns come before this job's."""
    queued = DeviceTask.objects.filter(job=job, status=DeviceTaskStatus.QUEUED)
    if not queued.exists() or DeviceTask.objects.filter(job=job, status=DeviceTaskStatus.LEASED).exists():
        return None
    backends = set(queued.values_list("backend", flat=True))
    running = (DeviceTask.objects.filter(organization_id=job.organization_id, status=DeviceTaskStatus.LEASED, backend__in=backends)
               .exclude(job=job).select_related("leased_by").order_by("started_at").first())
    if running is None:
        return None
    # Jobs served in turn (kiln.fleet.selectors.in_turn): the running task, then every other job whose turn comes first.
    waiting = DeviceTask.objects.filter(organization_id=job.organization_id, status=DeviceTaskStatus.QUEUED, backend__in=backends,
                                        job__status=JobStatus.RUNNING)
    turns = list(dict.fromkeys(task.job_id for task in in_turn(list(waiting)) if task.job_id != running.job_id))
    ahead = 1 + (turns.index(job.pk) if job.pk in turns else len(turns))
    queued_count = queued.count()
    device = running.leased_by.name if running.leased_by else "the device"
    since = queued.order_by("created_at").values_list("created_at", flat=True).first()
    return {"cause": DEVICE_BUSY, "position": ahead, "since": since.isoformat() if since else None,
            "message": f"device {device} busy with job {running.job_id}: {ahead} task{'s' if ahead != 1 else ''} ahead "
                       f"({queued_count} of this job's queued)"}


def job_waiting(job: DeploymentJob) -> dict | None:
    """Why the job waits now (`cause`, `position` = how many are ahead where known, `since`, `message`), or None when it
    is not waiting (running, or finished)."""
    if job.is_terminal:
        return None
    noted = job.waiting or {}
    if noted.get("cause"):
        return {"cause": noted["cause"], "position": noted.get("position"), "since": noted.get("since"), "message": noted["message"]}
    return _slot_wait(job) or _device_wait(job)
