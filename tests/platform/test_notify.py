"""Wake-ups: an offer wakes as many fitting waiters as it announces, longest-waiting first; no offer wakes all."""
from __future__ import annotations

import asyncio

import pytest

from kiln.core import notify


async def _woken(subscriptions, timeout: float = 0.3) -> list[bool]:
    results = await asyncio.gather(*(subscription.wait(timeout) for subscription in subscriptions))
    return list(results)


def _run(coroutine):
    return asyncio.run(coroutine)


def test_an_offer_wakes_only_as_many_waiters_as_it_announces_longest_waiting_first(settings, tmp_path):
    settings.DATA_DIR, settings.REDIS_URL = tmp_path, ""

    async def scenario():
        subscriptions = [notify.subscribe(["org-1"]) for _ in range(3)]
        for subscription in subscriptions:
            subscription.__enter__()
        subscriptions[0].hub.wake("org-1", {"count": 1})
        first = await _woken(subscriptions)
        subscriptions[0].hub.wake("org-1", {"count": 2})
        second = await _woken(subscriptions)
        for subscription in subscriptions:
            subscription.__exit__(None, None, None)
        return first, second

    first, second = _run(scenario())
    assert first == [True, False, False]
    # The one woken went to the back of the line: the next two wake-ups reach the others.
    assert second == [False, True, True]


def test_an_offer_skips_waiters_that_cannot_take_it(settings, tmp_path):
    settings.DATA_DIR, settings.REDIS_URL = tmp_path, ""

    async def scenario():
        openvino = notify.subscribe(["org-1"], accepts=lambda offer: offer.get("backend") == "openvino")
        onnxruntime = notify.subscribe(["org-1"], accepts=lambda offer: offer.get("backend") == "onnxruntime")
        with openvino, onnxruntime:
            openvino.hub.wake("org-1", {"count": 1, "backend": "onnxruntime"})
            return await _woken([openvino, onnxruntime])

    assert _run(scenario()) == [False, True]


def test_a_waiter_that_took_something_passes_the_wake_up_on(settings, tmp_path):
    settings.DATA_DIR, settings.REDIS_URL = tmp_path, ""

    async def scenario():
        taker, next_in_line, third = (notify.subscribe(["org-1"]) for _ in range(3))
        with taker, next_in_line, third:
            taker.pass_on()
            return await _woken([taker, next_in_line, third])

    assert _run(scenario()) == [False, True, False]


def test_a_publish_without_an_offer_wakes_every_waiter(settings, tmp_path):
    settings.DATA_DIR, settings.REDIS_URL = tmp_path, ""

    async def scenario():
        subscriptions = [notify.subscribe(["org-1"]) for _ in range(3)]
        for subscription in subscriptions:
            subscription.__enter__()
        subscriptions[0].hub.wake("org-1")
        return await _woken(subscriptions)

    assert _run(scenario()) == [True, True, True]


@pytest.mark.parametrize("broker", ["files", "redis"])
def test_a_published_offer_crosses_processes_and_wakes_one_waiter(settings, tmp_path, broker, monkeypatch):
    """Through the real transport: a wake file (embedded default) or Redis pub/sub."""
    settings.WAKE_PROBE_SECONDS = 60  # the periodic re-check must not be what wakes someone
    settings.DATA_DIR = tmp_path
    if broker == "files":
        settings.REDIS_URL = ""
    elif not settings.REDIS_URL:
        pytest.skip("REDIS_URL is not set: the Redis transport needs a Redis server")
    channel = f"test-offer-{broker}-{tmp_path.name}"

    async def scenario():
        subscriptions = [notify.subscribe([channel]) for _ in range(3)]
        for subscription in subscriptions:
            subscription.__enter__()
        hub = subscriptions[0].hub
        for _ in range(50):  # the listener is up once the hub says so
            if hub.connected:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(notify.FILE_POLL_S * 2)  # the file listener has seen the channel once
        await _woken(subscriptions, timeout=0.05)  # a fresh Redis subscription wakes everyone once: let that pass
        await asyncio.to_thread(notify.publish, channel, {"count": 1})
        woken = await _woken(subscriptions, timeout=2.0)
        for subscription in subscriptions:
            subscription.__exit__(None, None, None)
        return woken

    assert sorted(_run(scenario())) == [False, False, True]
