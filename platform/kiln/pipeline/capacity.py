"""Per-organization and per-host limits on host-side work: who may start a build or a sandboxed check now.

A `WorkSlot` row stands for one running piece of work of a class (`build`, `check`). Taking one is a count and an
insert under a lock on the organization's row, so two workers never both take an organization's last slot; the row is
renewed while the work runs and deleted when it ends, and a row whose process died expires on its own.

- Checks (sandboxed loads, exports and operator-support checks, at upload and in jobs): at most
  CHECKS_PER_ORGANIZATION per organization and SANDBOXES_PER_HOST per host, always.
- Builds: at most BUILDS_PER_ORGANIZATION per organization while another organization has builds waiting; alone, an
  organization uses every build slot (a limit nobody is waiting behind only slows its owner down).

A refused Celery task goes back on its queue (kiln.pipeline.admission); a refused upload is a 429 naming the limit.
"""
from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from kiln.accounts.models import Organization
from workers.routing import BUILD, CHECK

from .models import WorkSlot
from .queue import waiting_builds, waiting_stages

logger = logging.getLogger(__name__)

SLOT_SECONDS = 60


@dataclass(frozen=True)
class Refused:
    """Why a slot was not given: the limit that was hit, in words a user can act on."""

    work_class: str
    limit: int
    running: int
    scope: str  # "organization" or "host"

    @property
    def message(self) -> str:
        what = "model checks" if self.work_class == CHECK else "builds"
        setting = {("organization", CHECK): "KILN_CHECKS_PER_ORGANIZATION", ("host", CHECK): "KILN_SANDBOXES_PER_HOST",
                   ("organization", BUILD): "KILN_BUILDS_PER_ORGANIZATION"}.get((self.scope, self.work_class), "")
        whose = "your organization" if self.scope == "organization" else "this server"
        return (f"{whose} already runs {self.running} {what} at once, the limit ({setting}={self.limit}); "
                f"this one starts when one of them ends")


def host_name() -> str:
    return socket.gethostname()[:255]


def _live(queryset):
    return queryset.filter(expires_at__gt=timezone.now())


def organization_limit(work_class: str) -> int:
    return settings.CHECKS_PER_ORGANIZATION if work_class == CHECK else settings.BUILDS_PER_ORGANIZATION


def others_waiting_for_builds(*, organization_id: int) -> bool:
    """Whether another organization has build-class work sent and not yet started."""
    return (waiting_builds().exclude(organization_id=organization_id).exists()
            or waiting_stages(BUILD).exclude(organization_id=organization_id).exists())


def _refusal(*, organization_id: int, work_class: str) -> Refused | None:
    running = _live(WorkSlot.objects.filter(organization_id=organization_id, work_class=work_class)).count()
    limit = organization_limit(work_class)
    if running >= limit and (work_class == CHECK or others_waiting_for_builds(organization_id=organization_id)):
        return Refused(work_class, limit, running, "organization")
    if work_class == CHECK:
        on_host = _live(WorkSlot.objects.filter(work_class=CHECK, host=host_name())).count()
        if on_host >= settings.SANDBOXES_PER_HOST:
            return Refused(CHECK, settings.SANDBOXES_PER_HOST, on_host, "host")
    return None


def slot_acquire(*, organization_id: int, work_class: str, holder: str, job_id: int | None = None) -> WorkSlot | Refused:
    """Take a slot of `work_class` for the organization, or say which limit refuses it."""
    with transaction.atomic():
        # The organization's row is the lock: counting and inserting are one step for each organization.
        Organization.objects.select_for_update().filter(pk=organization_id).first()
        refused = _refusal(organization_id=organization_id, work_class=work_class)
        if refused is not None:
            return refused
        return WorkSlot.objects.create(organization_id=organization_id, job_id=job_id, work_class=work_class, holder=holder[:200],
                                       host=host_name(), expires_at=timezone.now() + timedelta(seconds=SLOT_SECONDS))


def slot_release(slot: WorkSlot) -> None:
    WorkSlot.objects.filter(pk=slot.pk).delete()


def slots_expire() -> int:
    """Delete the rows of work whose process stopped renewing them (housekeeping)."""
    deleted, _ = WorkSlot.objects.filter(expires_at__lte=timezone.now()).delete()
    return deleted


@contextmanager
def slot_kept(slot: WorkSlot) -> Iterator[WorkSlot]:
    """Renew the slot from a side thread while the body runs; give it back afterwards, whatever happens."""
    stop = threading.Event()

    def renew() -> None:
        try:
            while not stop.wait(SLOT_SECONDS / 3):
                WorkSlot.objects.filter(pk=slot.pk).update(expires_at=timezone.now() + timedelta(seconds=SLOT_SECONDS))
        except Exception:
            logger.exception("could not renew work slot %s", slot.pk)
        finally:
            connection.close()

    thread = threading.Thread(target=renew, name=f"work-slot-{slot.pk}", daemon=True)
    thread.start()
    try:
        yield slot
    finally:
        stop.set()
        thread.join()
        slot_release(slot)


class LimitReached(Exception):
    """A per-organization or per-host limit refused the work; `refused` says which."""

    def __init__(self, refused: Refused):
        super().__init__(refused.message)
        self.refused = refused


@contextmanager
def slot_held(*, organization_id: int, work_class: str, holder: str, job_id: int | None = None) -> Iterator[WorkSlot]:
    """Hold a slot for the body, or raise LimitReached at once (a request answers 429; a task goes back on its queue)."""
    slot = slot_acquire(organization_id=organization_id, work_class=work_class, holder=holder, job_id=job_id)
    if isinstance(slot, Refused):
        raise LimitReached(slot)
    with slot_kept(slot):
        yield slot
