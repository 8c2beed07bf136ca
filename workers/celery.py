"""The Celery app: JSON-only messages, late acks, results kept in the database rows."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from celery import Celery
from celery.signals import task_postrun, task_prerun
from django.conf import settings

from workers.routing import CONTROL, PRIORITY_STEPS, task_routes
from workers.workdir import task_work_dir_enter, task_work_dir_leave

_PLATFORM_DIR = Path(__file__).resolve().parent.parent / "platform"
if str(_PLATFORM_DIR) not in sys.path:
    sys.path.insert(0, str(_PLATFORM_DIR))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kiln.settings")

app = Celery("kiln")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    event_serializer="json",
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    # Work classes on queues of their own (workers/routing.py); anything unrouted is a control step.
    task_default_queue=CONTROL,
    task_routes=task_routes(),
    # A message without a priority of its own is served first among its queue's (Redis: 0 is first).
    task_default_priority=0,
    # With KILN_LOG_JSON the worker keeps Django's LOGGING (JSON lines with job and task ids).
    worker_hijack_root_logger=not settings.LOG_JSON,
)


def _configure_priorities() -> None:
    """Redis keeps one list per priority step and serves lower numbers first (the filesystem broker has no priorities:
    there every queue is first come, first served)."""
    if str(settings.CELERY_BROKER_URL).startswith(("redis://", "rediss://")):
        app.conf.broker_transport_options = {**(app.conf.broker_transport_options or {}), "priority_steps": PRIORITY_STEPS}


def _configure_filesystem_broker() -> None:
    """The embedded default: a broker in a folder, so `make up` needs no Redis."""
    if not str(settings.CELERY_BROKER_URL).startswith("filesystem://"):
        return
    queue_dir = Path(settings.CELERY_QUEUE_DIR)
    (queue_dir / "out").mkdir(parents=True, exist_ok=True)
    (queue_dir / "processed").mkdir(parents=True, exist_ok=True)
    (queue_dir / "control").mkdir(parents=True, exist_ok=True)
    app.conf.broker_transport_options = {
        "data_folder_in": str(queue_dir / "out"),
        "data_folder_out": str(queue_dir / "out"),
        "processed_folder": str(queue_dir / "processed"),
        "store_processed": False,
        "control_folder": str(queue_dir / "control"),
    }


def _configure_beat() -> None:
    """Housekeeping on a schedule; each message expires after one period so that a backlog is dropped."""
    period = float(settings.HOUSEKEEPING_SECONDS)
    app.conf.beat_schedule = {
        name: {"task": f"kiln.housekeeping.{name}", "schedule": period, "options": {"expires": period}}
        for name in HOUSEKEEPING_TASKS
    }


HOUSEKEEPING_TASKS = ("requeue_expired_leases", "redispatch_waiting", "mark_agents_offline", "reap_stuck_work", "expire_uploads",
                      "expire_work_slots")


@task_prerun.connect
def _enter_task_work_dir(task_id=None, **_):
    """Each task runs in its own temporary working directory (libraries write scratch files there)."""
    task_work_dir_enter(str(task_id))


@task_postrun.connect
def _leave_task_work_dir(task_id=None, **_):
    task_work_dir_leave(str(task_id))


_configure_filesystem_broker()
_configure_priorities()
_configure_beat()
# Lazy: the tasks import the pipeline, which needs Django's apps; Celery's Django fixup sets them
# up before the worker imports this, and the web process only resolves tasks by name.
app.autodiscover_tasks(["workers"], related_name="tasks")
