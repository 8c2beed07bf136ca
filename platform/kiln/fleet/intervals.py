"""The intervals the server tells its agents, chosen from the size of the fleet (as Buildkite's agents are told).

An idle agent costs the server one lease long-poll per `long_poll_s` (the long-poll is its
heartbeat), and an agent running a task one heartbeat per `heartbeat_interval_s`. Both start at
their settings (KILN_AGENT_LONG_POLL_SECONDS, KILN_AGENT_HEARTBEAT_SECONDS) and stretch once the
online fleet would send more than KILN_AGENT_POLLS_PER_SECOND of them, up to ceilings that keep
an agent online (a long-poll ends well before KILN_AGENT_OFFLINE_AFTER_SECONDS) and a cancel
prompt (a heartbeat at least four times per lease). Agents add their own jitter.

The fleet is counted in the database (every organization: they share the servers) at most once per
FLEET_COUNT_SECONDS per process, from a thread that may query; answers read the last count.
"""
from __future__ import annotations

import math
import threading
import time

from django.conf import settings

from .selectors import agents_online_count

FLEET_COUNT_SECONDS = 30.0
# Nothing longer than this stays open through the usual load balancers' idle timeouts (60 s).
LONG_POLL_CEILING_S = 50

_lock = threading.Lock()
_fleet = {"size": 0, "counted_at": -math.inf}


def intervals_for(fleet_size: int) -> dict:
    """The intervals for a fleet of `fleet_size` online agents."""
    spread_s = fleet_size / max(1, settings.AGENT_POLLS_PER_SECOND)
    long_poll_floor = settings.AGENT_LONG_POLL_SECONDS
    long_poll_ceiling = max(long_poll_floor, min(LONG_POLL_CEILING_S, settings.AGENT_OFFLINE_AFTER_SECONDS * 3 // 4))
    heartbeat_floor = settings.AGENT_HEARTBEAT_SECONDS
    heartbeat_ceiling = max(heartbeat_floor, settings.AGENT_LEASE_SECONDS // 4)
    return {
        "heartbeat_interval_s": min(heartbeat_ceiling, max(heartbeat_floor, math.ceil(spread_s))),
        "poll_interval_s": settings.AGENT_POLL_SECONDS,
        "long_poll_s": min(long_poll_ceiling, max(long_poll_floor, math.ceil(spread_s))),
        "lease_seconds": settings.AGENT_LEASE_SECONDS,
    }


def agent_intervals() -> dict:
    """The intervals for the fleet as this process last counted it; no query (safe on the event loop)."""
    return intervals_for(_fleet["size"])


def interval_headers() -> dict[str, str]:
    """The same, as the headers of every lease answer: an idle agent learns them without a heartbeat."""
    intervals = agent_intervals()
    return {"Kiln-Long-Poll": str(intervals["long_poll_s"]), "Kiln-Heartbeat-Interval": str(intervals["heartbeat_interval_s"]),
            "Kiln-Poll-Interval": str(intervals["poll_interval_s"])}


def fleet_count_refresh() -> None:
    """Count the online fleet if this process's count is older than FLEET_COUNT_SECONDS (one query; call where queries may run)."""
    now = time.monotonic()
    with _lock:
        if now - _fleet["counted_at"] < FLEET_COUNT_SECONDS:
            return
        # Claimed before the query: the other threads of this process keep the old count meanwhile.
        _fleet["counted_at"] = now
    _fleet["size"] = agents_online_count()


def clear() -> None:
    """Forget the count (tests)."""
    with _lock:
        _fleet.update(size=0, counted_at=-math.inf)
