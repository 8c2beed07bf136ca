"""Work leases of host-side tasks: offered when a task is sent, claimed by the worker that runs it,
renewed while it runs, released when it ends. `kiln.pipeline.reaper` sends again what expired.

A claim is a compare-and-set on the row, so a duplicate message (a redelivery after a worker
died, a reaper's re-send racing the original) finds the lease held and does nothing: each stage
and each variant build runs once at a time, and a finished one is not redone.
"""
from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.db.models import F, Q
from django.utils import timezone

from .models import DeploymentJob, Variant

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseKind:
    model: type
    owner: str
    expires: str
    attempts: str
    offered: str


STAGE = LeaseKind(DeploymentJob, "stage_lease_owner", "stage_lease_expires_at", "stage_attempts", "stage_offered_at")
BUILD = LeaseKind(Variant, "build_lease_owner", "build_lease_expires_at", "build_attempts", "build_offered_at")


def _in(seconds: float):
    return timezone.now() + timedelta(seconds=seconds)


def lease_offer(kind: LeaseKind, pk: int, *, resend: bool = False, **fields) -> None:
    """A task for this row was sent: anyone may claim it; unclaimed after the grace, it is sent again.

    A new task starts counting its attempts (claims) from zero; a re-send goes on counting.
    """
    if not resend:
        fields[kind.attempts] = 0
        fields[kind.offered] = timezone.now()
    kind.model.objects.filter(pk=pk).update(**{kind.owner: "", kind.expires: _in(settings.WORK_QUEUE_GRACE_SECONDS)}, **fields)


def lease_offer_extend(kind: LeaseKind, pk: int) -> int:
    """A sent task still waits behind busy workers of its class: it is not lost, so the reaper leaves it another grace."""
    return kind.model.objects.filter(pk=pk, **{kind.owner: ""}).update(**{kind.expires: _in(settings.WORK_QUEUE_GRACE_SECONDS)})


def lease_claim(kind: LeaseKind, pk: int, match: Q | None = None) -> str | None:
    """Take the lease for one run (a token), or None while another live run holds it."""
    token, now = uuid.uuid4().hex, timezone.now()
    free = Q(**{kind.owner: ""}) | Q(**{f"{kind.expires}__lt": now}) | Q(**{f"{kind.expires}__isnull": True})
    claimed = kind.model.objects.filter(Q(pk=pk) & (match or Q()) & free).update(
        **{kind.owner: token, kind.expires: now + timedelta(seconds=settings.WORK_LEASE_SECONDS), kind.attempts: F(kind.attempts) + 1}
    )
    return token if claimed else None


@contextmanager
def lease_kept(kind: LeaseKind, pk: int, token: str) -> Iterator[None]:
    """Renew the lease from a side thread while the body runs; release it afterwards."""
    stop = threading.Event()
    held = kind.model.objects.filter(pk=pk, **{kind.owner: token})

    def renew() -> None:
        try:
            while not stop.wait(settings.WORK_LEASE_SECONDS / 3):
                held.update(**{kind.expires: _in(settings.WORK_LEASE_SECONDS)})
        except Exception:
            logger.exception("could not renew the work lease of %s %s", kind.model.__name__, pk)
        finally:
            connection.close()

    thread = threading.Thread(target=renew, name=f"lease-{kind.model.__name__}-{pk}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        # A lease offered again meanwhile (the next stage was sent) has another owner and stays.
        held.update(**{kind.owner: "", kind.expires: None})


def run_leased(kind: LeaseKind, pk: int, work: Callable[[], None], match: Q | None = None) -> bool:
    """Run `work` under the row's lease; False (and nothing run) when another run holds it."""
    token = lease_claim(kind, pk, match)
    if token is None:
        logger.info("%s %s is being worked on elsewhere; this delivery is dropped", kind.model.__name__, pk)
        return False
    with lease_kept(kind, pk, token):
        work()
    return True


def stage_run_leased(*, job_id: int, stage: str, work: Callable[..., object]) -> bool:
    """Run one host-side stage task of a job under the job's stage lease."""
    # The lease offered is for the stage sent last: a stray message of another stage claims nothing
    # (a job from before work leases has none recorded, and any stage may claim it).
    return run_leased(STAGE, job_id, lambda: work(job_id=job_id), Q(stage_task=stage) | Q(stage_task=""))


def variant_build_leased(*, variant_id: int, work: Callable[..., object]) -> bool:
    """Run one variant build under the variant's build lease."""
    return run_leased(BUILD, variant_id, lambda: work(variant_id=variant_id))
