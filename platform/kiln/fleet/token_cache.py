"""Agents behind their token digests, remembered in this process for AGENT_AUTH_CACHE_SECONDS.

Every agent call presents its token; looking it up is a database query, and a fleet calls all the
time. A revocation in this process forgets the agent at once; other server processes keep
accepting its token until their entry expires (at most AGENT_AUTH_CACHE_SECONDS).

An entry lives a random 50-100 % of that period: a fleet that enrolled within a few seconds would
otherwise have all its tokens expire within the same few seconds, every period, and the lookups of
1,000 agents queue up behind one another (seconds of heartbeat and lease latency).
"""
from __future__ import annotations

import copy
import random
import threading
import time
from collections import OrderedDict

from django.conf import settings

from .models import Agent

MAX_ENTRIES = 20_000

_lock = threading.Lock()
# digest -> (expires at, monotonic; the agent as read then). Oldest first, for eviction.
_entries: OrderedDict[str, tuple[float, Agent]] = OrderedDict()
# agent id -> when it was forgotten: a lookup that began before then must not remember it again.
_forgotten: dict[int, float] = {}


def lookup_started() -> float:
    """Call before reading an agent from the database; pass the value to agent_remember."""
    return time.monotonic()


def agent_cached(digest: str) -> Agent | None:
    """A copy of the agent remembered for this token digest, or None (unknown or expired)."""
    now = time.monotonic()
    with _lock:
        entry = _entries.get(digest)
        if entry is None:
            return None
        if entry[0] <= now:
            del _entries[digest]
            return None
    # A copy: a request may change its agent's attributes; the remembered one stays as read.
    return copy.copy(entry[1])


def agent_remember(digest: str, agent: Agent, looked_up_at: float) -> None:
    """Remember an agent read at `looked_up_at`, unless it was revoked (forgotten) since."""
    ttl = settings.AGENT_AUTH_CACHE_SECONDS
    if ttl <= 0:
        return
    with _lock:
        if _forgotten.get(agent.pk, float("-inf")) >= looked_up_at:
            return
        _entries[digest] = (time.monotonic() + ttl * random.uniform(0.5, 1.0), copy.copy(agent))
        _entries.move_to_end(digest)
        while len(_entries) > MAX_ENTRIES:
            _entries.popitem(last=False)


def agent_forget(agent_id: int) -> None:
    """Drop every entry of this agent (revoked, or its capabilities changed)."""
    now = time.monotonic()
    with _lock:
        for digest in [d for d, (_, agent) in _entries.items() if agent.pk == agent_id]:
            del _entries[digest]
        _forgotten[agent_id] = now
        # A lookup lasts far less than a TTL: older marks can go.
        horizon = now - max(60.0, 2 * settings.AGENT_AUTH_CACHE_SECONDS)
        for stale in [i for i, at in _forgotten.items() if at < horizon]:
            del _forgotten[stale]


def clear() -> None:
    with _lock:
        _entries.clear()
        _forgotten.clear()
