"""Agents behind their token digests, remembered in this process for AGENT_AUTH_CACHE_SECONDS.

Every agent call presents its token; looking it up is a database query, and a fleet calls all the
time. A revocation in this process forgets the agent at once; other server processes keep
accepting its token until their entry expires (at most AGENT_AUTH_CACHE_SECONDS). The mechanics
(digest keys, bounded size, jittered expiry) are kiln.core.token_cache's.
"""
from __future__ import annotations

from django.conf import settings

from kiln.core.token_cache import DigestCache

from .models import Agent

_cache: DigestCache[Agent] = DigestCache(lambda: settings.AGENT_AUTH_CACHE_SECONDS)

lookup_started = _cache.lookup_started


def agent_cached(digest: str) -> Agent | None:
    """A copy of the agent remembered for this token digest, or None (unknown or expired)."""
    return _cache.get(digest)


def agent_remember(digest: str, agent: Agent, looked_up_at: float) -> None:
    """Remember an agent read at `looked_up_at`, unless it was revoked (forgotten) since."""
    _cache.remember(digest, agent, (agent.pk,), looked_up_at)


def agent_forget(agent_id: int) -> None:
    """Drop every entry of this agent (revoked, or its capabilities changed)."""
    _cache.forget(agent_id)


def clear() -> None:
    _cache.clear()
