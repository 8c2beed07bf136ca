"""Per process: who last found nothing to lease, and at which wake-up generation of its organization.

Every long-poll looks for work at least once, and an idle fleet's answer is nearly always "none".
Whatever makes a task leasable (dispatch, requeue, an expired lease, a re-timing round) wakes the
organization's channel (`kiln.pipeline.queue.wake_agents`), which changes the channel's generation
(`kiln.core.notify.generation`). So an organization found empty at generation G is still empty
while the generation reads G, and an agent that found nothing it could run, likewise: the look
costs one Redis GET or one stat instead of SQL. A note older than MAX_AGE_S is not trusted (a
publish that failed while Redis was down changed no generation).
"""
from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict

MAX_AGE_S = 5.0
MAX_AGENTS = 50_000

_lock = threading.Lock()
# organization id -> (generation, noted at) when it had no queued task at all.
_empty_organizations: dict[int, tuple[str, float]] = {}
# agent id -> (generation, what the agent could run then, noted at) when none of the queued tasks fit it.
_idle_agents: OrderedDict[int, tuple[str, tuple, float]] = OrderedDict()


def _fits_signature(agent) -> tuple:
    """What decides which tasks an agent may run (beyond its id): its runtimes and labels."""
    return tuple(sorted(agent.backends)), json.dumps(agent.labels or {}, sort_keys=True)


def nothing_new(*, agent, generation: str | None) -> bool:
    """Whether this agent's last look already found nothing and nothing was published since."""
    if generation is None:
        return False
    oldest = time.monotonic() - MAX_AGE_S
    with _lock:
        empty = _empty_organizations.get(agent.organization_id)
        if empty is not None and empty[0] == generation and empty[1] >= oldest:
            return True
        idle = _idle_agents.get(agent.pk)
    return idle is not None and idle[0] == generation and idle[2] >= oldest and idle[1] == _fits_signature(agent)


def organization_found_empty(*, organization_id: int, generation: str | None) -> None:
    if generation is not None:
        with _lock:
            _empty_organizations[organization_id] = (generation, time.monotonic())


def agent_found_nothing(*, agent, generation: str | None) -> None:
    if generation is None:
        return
    with _lock:
        _idle_agents[agent.pk] = (generation, _fits_signature(agent), time.monotonic())
        _idle_agents.move_to_end(agent.pk)
        while len(_idle_agents) > MAX_AGENTS:
            _idle_agents.popitem(last=False)


def clear() -> None:
    with _lock:
        _empty_organizations.clear()
        _idle_agents.clear()
