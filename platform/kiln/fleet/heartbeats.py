"""Agent heartbeats, batched: kept in this process's memory, written in one UPDATE per flush.

A fleet heartbeats all the time (1,000 agents: 100 a second), and each one used to be an UPDATE
of its own. Now a heartbeat of a known, online agent only notes the time here; a flusher thread
writes every noted time in one UPDATE each AGENT_HEARTBEAT_FLUSH_SECONDS. What the database shows
is at most that old, against the AGENT_OFFLINE_AFTER_SECONDS (60) it takes to count an agent
offline; this process's readers see the noted times at once through `heartbeats_overlay`.

In memory, not in Redis: a heartbeat then needs no round trip, and a Redis restart loses no
heartbeat (the agents would otherwise drop offline while it is down). A process that dies loses at
most one flush period of heartbeats, which the agents' next heartbeats replace.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import time
from datetime import datetime

from django.conf import settings
from django.db import Error, connections
from django.db.models import Case, DateTimeField, Value, When

from .models import Agent

logger = logging.getLogger(__name__)

_lock = threading.Lock()
# Held for a whole flush, from taking the batch to its UPDATE: `clear` waits for a flush under way, so no batch
# taken before it is written after it.
_flush_lock = threading.Lock()
_pending: dict[int, datetime] = {}
_flusher: threading.Thread | None = None


def heartbeat_record(*, agent_id: int, at: datetime) -> None:
    """Note that an agent was seen at `at`; the flusher writes it to the database soon."""
    with _lock:
        if agent_id not in _pending or _pending[agent_id] < at:
            _pending[agent_id] = at
    _flusher_ensure()


def heartbeats_pending() -> dict[int, datetime]:
    """Agent id -> last seen, for heartbeats this process noted and has not written yet."""
    with _lock:
        return dict(_pending)


def heartbeats_overlay(agents):
    """The agents with their last heartbeat as this process knows it: the only way to read it.

    The database's `last_heartbeat_at` lags by up to one flush; this adds what is pending here.
    """
    for agent in agents:
        with _lock:
            seen = _pending.get(agent.pk)
        if seen is not None and (agent.last_heartbeat_at is None or agent.last_heartbeat_at < seen):
            agent.last_heartbeat_at = seen
            if agent.offline_since is not None and agent.offline_since < seen:
                agent.offline_since = None
    return agents


def agent_seen_online(agent) -> bool:
    """Whether an agent counts as online, with this process's pending heartbeats."""
    return heartbeats_overlay([agent])[0].online


def heartbeats_flush() -> int:
    """Write every pending heartbeat in one UPDATE; returns how many agents it covered."""
    with _flush_lock:
        return _flush_batch()


def _flush_batch() -> int:
    with _lock:
        batch = dict(_pending)
        _pending.clear()
    if not batch:
        return 0
    try:
        Agent.objects.filter(pk__in=list(batch)).update(
            last_heartbeat_at=Case(*[When(pk=agent_id, then=Value(at)) for agent_id, at in batch.items()], output_field=DateTimeField()),
            offline_since=None,
        )
    except Exception:
        # Back into the batch (newer notes win): the next flush tries again.
        with _lock:
            for agent_id, at in batch.items():
                if agent_id not in _pending or _pending[agent_id] < at:
                    _pending[agent_id] = at
        raise
    return len(batch)


def _flush_forever() -> None:
    while True:
        time.sleep(settings.AGENT_HEARTBEAT_FLUSH_SECONDS)
        try:
            heartbeats_flush()
        except Error as exc:
            logger.warning("could not write %d agent heartbeat(s); retrying: %s", len(_pending), exc)
        except Exception:
            # The thread must outlive any surprise, or heartbeats would pile up unwritten.
            logger.exception("could not write %d agent heartbeat(s); retrying", len(_pending))
        finally:
            # This thread's connection goes back (to the pool); it sleeps most of the time.
            connections.close_all()


def _flusher_ensure() -> None:
    """Start this process's flusher thread once (again in a forked child, where it does not run)."""
    global _flusher
    if _flusher is not None and _flusher.is_alive():
        return
    with _lock:
        if _flusher is None or not _flusher.is_alive():
            _flusher = threading.Thread(target=_flush_forever, name="kiln-heartbeat-flush", daemon=True)
            _flusher.start()


def clear() -> None:
    """Forget unwritten heartbeats, including a batch a flush has taken and not yet written (tests: each starts
    with none, and a heartbeat noted before cannot land after)."""
    with _flush_lock, _lock:
        _pending.clear()


@atexit.register
def _flush_at_exit() -> None:
    # Best effort while the process ends (the database may be gone); the agents heartbeat again.
    with contextlib.suppress(Exception):
        heartbeats_flush()
