"""Agents behind their token digests, remembered in this process for AGENT_AUTH_CACHE_SECONDS.

Every agent call presents its token; looking it up is a database query, and a fleet calls all the
time. A revocation takes effect at once in every server process: this one forgets the agent, the
others see the revocation generation change (kiln.core.revocations). The mechanics (digest keys,
bounded size, jittered expiry, the generation check) are kiln.core.token_cache's.
"""
from __future__ import annotations

from django.conf import settings

from kiln.core.revocations import revocation_generation
from kiln.core.token_cache import DigestCache, Lookup

from .models import Agent

_cache: DigestCache[Agent] = DigestCache(lambda: settings.AGENT_AUTH_CACHE_SECONDS, generation=revocation_generation)

lookup_started = _cache.lookup_started


def agent_cached(digest: str) -> Agent | None:
    """A copy of the agent remembered for this token digest, or None (unknown or expired)."""
    return _cache.get(digest)


def agent_remember(digest: str, agent: Agent, looked_up_at: Lookup) -> None:
    """Remember an agent read at `looked_up_at`, unless it was revoked (forgotten) since."""
    _cache.remember(digest, agent, (agent.pk,), looked_up_at)


def agent_forget(agent_id: int) -> None:
    """Drop every entry of this agent (revoked, or its capabilities changed)."""
    _cache.forget(agent_id)


def clear() -> None:
    _cache.clear()
