"""Agent registrations run at most AGENT_REGISTER_CONCURRENCY at a time per server process."""
from __future__ import annotations

import asyncio

from kiln.core.asgi import KilnASGIHandler


def _scope(path: str) -> dict:
    return {"type": "http", "path": path, "method": "POST", "headers": []}


def test_a_burst_of_registrations_runs_a_few_at_a_time_and_other_agent_calls_pass_it(settings):
    settings.AGENT_REGISTER_CONCURRENCY = 2
    handler = KilnASGIHandler()
    running = {"register": 0}
    most = {"register": 0}

    async def scenario():
        release = asyncio.Event()
        heartbeat_passed = asyncio.Event()

        async def fake_handle(scope, receive, send):
            if scope["path"].endswith("heartbeat"):
                heartbeat_passed.set()
                return
            running["register"] += 1
            most["register"] = max(most["register"], running["register"])
            await release.wait()
            running["register"] -= 1

        handler.agent_routes.handle = fake_handle
        registrations = [asyncio.create_task(handler(_scope("/api/agent/v1/register"), None, None)) for _ in range(6)]
        for _ in range(20):  # let every registration get as far as it can
            await asyncio.sleep(0)
        admitted_during_burst = running["register"]
        # A heartbeat is not queued behind the waiting registrations.
        await handler(_scope("/api/agent/v1/heartbeat"), None, None)
        release.set()
        await asyncio.gather(*registrations)
        return admitted_during_burst, heartbeat_passed.is_set()

    admitted, heartbeat_passed = asyncio.run(scenario())
    assert admitted == 2
    assert most["register"] == 2
    assert heartbeat_passed
    assert running["register"] == 0
