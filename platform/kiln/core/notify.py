"""Wake-ups across processes: a waiter sleeps until someone publishes on one of its channels.

With REDIS_URL set, publishing is a Redis PUBLISH and every server process holds one pattern
subscription that wakes its local waiters. Without Redis (the embedded default) a publish touches
a file under $KILN_DATA_DIR/wake and each server process stats the files its waiters watch a few
times a second: a stat per channel, not a database query per waiter.

A publish may carry an offer (`{"count": n, ...}`: n new things to take, and what a taker must
fit). Then only the n longest-waiting waiters that accept it wake, not every waiter of the channel:
a task queued in an organization of a thousand waiting agents costs one database check, not a
thousand. Without an offer every waiter wakes (a cancel, a reconnect).

Wake-ups are hints. A waiter re-checks the database when woken; one that took something passes
the wake-up on to the next waiter (there may be more than the offer said, or an offer was lost);
every KILN_WAKE_PROBE_SECONDS (3) the longest waiter of each channel in each process re-checks anyway; and while the Redis
subscription is down every waiter re-checks every FALLBACK_RECHECK_S seconds. So a lost wake-up
costs a few seconds of latency, never work.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
import weakref
from collections import defaultdict
from pathlib import Path

import redis
import redis.asyncio as aioredis
from django.conf import settings

logger = logging.getLogger(__name__)

PREFIX = "kiln:wake:"
GENERATION_PREFIX = "kiln:wake-generation:"
FILE_POLL_S = 0.2
FALLBACK_RECHECK_S = 1.0
RECONNECT_MAX_S = 5.0
CLOSE_TIMEOUT_S = 1.0
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")

_sync_client: redis.Redis | None = None


def organization_channel(organization_id: int) -> str:
    return f"org-{organization_id}"


def _wake_file(channel: str) -> Path:
    return Path(settings.DATA_DIR) / "wake" / _SAFE.sub("_", channel)


def _redis() -> redis.Redis:
    global _sync_client
    if _sync_client is None:
        _sync_client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    return _sync_client


def _fresh_generation() -> str:
    return f"{os.getpid()}-{time.time_ns()}"


def publish(channel: str, offer: dict | None = None) -> None:
    """Wake the waiters of `channel` in every server process (all, or as many as `offer` says); never raises."""
    message = json.dumps(offer or {})
    try:
        if settings.REDIS_URL:
            # The generation first: a waiter woken by the message must read the new one.
            _redis().pipeline(transaction=False).set(GENERATION_PREFIX + channel, _fresh_generation()).publish(PREFIX + channel, message).execute()
        else:
            path = _wake_file(channel)
            path.parent.mkdir(parents=True, exist_ok=True)
            # A whole new file (the listener reads the offer with the change): never a half-written one.
            fresh = path.with_name(f".{path.name}.{os.getpid()}.{time.time_ns()}")
            fresh.write_text(message)
            os.replace(fresh, path)
            # Two publishes in one clock tick would share an mtime; a fresh ns time does not.
            os.utime(path, ns=(os.stat(path).st_atime_ns, max(os.stat(path).st_mtime_ns + 1, time.time_ns())))
    except (redis.RedisError, OSError) as exc:
        logger.warning("could not publish a wake-up on %s: %s", channel, exc)


def generation(channel: str) -> str | None:
    """A token that changes with every publish on `channel` (a Redis key, or the wake file's change
    time); None when it cannot be read. Equal tokens: nothing was published in between.

    Unlike a wake-up, it cannot be missed: a reader that remembers it can tell later whether
    anything happened since, even if it was not listening then.
    """
    try:
        if settings.REDIS_URL:
            value = _redis().get(GENERATION_PREFIX + channel)
            if value is None:
                # Never published, or Redis lost its data: a new token, never one seen before.
                _redis().set(GENERATION_PREFIX + channel, _fresh_generation(), nx=True)
                value = _redis().get(GENERATION_PREFIX + channel)
            return value.decode() if value is not None else None
        stat = _wake_file(channel).stat()
        return f"{stat.st_ino}-{stat.st_mtime_ns}"
    except FileNotFoundError:
        return "none"
    except (redis.RedisError, OSError) as exc:
        logger.warning("could not read the wake-up generation of %s: %s", channel, exc)
        return None


def _offer(raw) -> dict:
    try:
        offer = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return offer if isinstance(offer, dict) else {}


class Subscription:
    """One waiter's interest in some channels; use as a context manager around the wait loop."""

    def __init__(self, hub: _Hub, channels: list[str], accepts=None):
        self.hub = hub
        self.channels = channels
        # accepts(offer) -> bool: whether this waiter could take what an offer announces.
        self.accepts = accepts or (lambda offer: True)
        self.event = asyncio.Event()

    def __enter__(self) -> Subscription:
        for channel in self.channels:
            self.hub.add(channel, self)
        return self

    def __exit__(self, *exc) -> None:
        for channel in self.channels:
            self.hub.remove(channel, self)

    async def wait(self, timeout: float) -> bool:
        """Sleep until woken or `timeout` passes; True when woken."""
        if not self.hub.connected:
            timeout = min(timeout, FALLBACK_RECHECK_S)
        try:
            await asyncio.wait_for(self.event.wait(), max(0.0, timeout))
            return True
        except TimeoutError:
            return False
        finally:
            self.event.clear()

    def pass_on(self) -> None:
        """This waiter took something: wake the next one of its channels, there may be more."""
        for channel in self.channels:
            self.hub.wake(channel, {"count": 1}, skip=self)


class _Hub:
    """The waiters of one event loop and the listener that wakes them."""

    def __init__(self):
        # Per channel, the waiters longest-waiting first (a dict keeps insertion order).
        self.waiters: dict[str, dict[Subscription, None]] = defaultdict(dict)
        self.connected = False
        loop = asyncio.get_running_loop()
        self.task = loop.create_task(self._listen())
        self.prober = loop.create_task(self._probe())

    def add(self, channel: str, subscription: Subscription) -> None:
        self.waiters[channel][subscription] = None

    def remove(self, channel: str, subscription: Subscription) -> None:
        waiting = self.waiters.get(channel)
        if waiting is not None:
            waiting.pop(subscription, None)
            if not waiting:
                del self.waiters[channel]

    def wake(self, channel: str, offer: dict | None = None, skip: Subscription | None = None) -> None:
        """Wake every waiter of `channel`, or the `count` longest-waiting ones that accept the offer."""
        count = (offer or {}).get("count")
        waiting = self.waiters.get(channel, {})
        if not isinstance(count, int):
            for subscription in list(waiting):
                subscription.event.set()
            return
        for subscription in list(waiting):
            if count <= 0:
                break
            if subscription is skip or subscription.event.is_set() or not subscription.accepts(offer):
                continue
            subscription.event.set()
            # Woken waiters go to the back: the next wake-up (or probe) reaches someone else.
            waiting.pop(subscription, None)
            waiting[subscription] = None
            count -= 1

    async def _probe(self) -> None:
        while True:
            await asyncio.sleep(settings.WAKE_PROBE_SECONDS)
            for channel in list(self.waiters):
                self.wake(channel, {"count": 1})

    async def _listen(self) -> None:
        if settings.REDIS_URL:
            await self._listen_redis()
        else:
            await self._listen_files()

    async def _listen_files(self) -> None:
        self.connected = True
        seen: dict[str, int] = {}
        while True:
            for channel in list(self.waiters):
                try:
                    mtime = _wake_file(channel).stat().st_mtime_ns
                except FileNotFoundError:
                    mtime = 0
                if channel in seen and seen[channel] != mtime:
                    try:
                        self.wake(channel, _offer(_wake_file(channel).read_bytes()))
                    except OSError:
                        self.wake(channel)
                seen[channel] = mtime
            for channel in [c for c in seen if c not in self.waiters]:
                del seen[channel]
            await asyncio.sleep(FILE_POLL_S)

    async def _listen_redis(self) -> None:
        delay = 0.2
        while True:
            client = aioredis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, health_check_interval=10)
            pubsub = client.pubsub()
            try:
                await pubsub.psubscribe(PREFIX + "*")
                self.connected, delay = True, 0.2
                # Anything published while we were away: let every waiter re-check once.
                for channel in list(self.waiters):
                    self.wake(channel)
                async for message in pubsub.listen():
                    if message.get("type") == "pmessage":
                        channel = message["channel"]
                        channel = channel.decode() if isinstance(channel, bytes) else channel
                        self.wake(channel[len(PREFIX):], _offer(message.get("data")))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.connected:
                    logger.warning("wake-up subscription lost (%s); waiters re-check every %.0f s until it is back", exc, FALLBACK_RECHECK_S)
                self.connected = False
            finally:
                # Bounded: a loop being closed (async_to_sync, tests) cancels this task, and a graceful
                # close of a half-open connection could otherwise wait forever and hang the close.
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(pubsub.aclose(), CLOSE_TIMEOUT_S)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.aclose(), CLOSE_TIMEOUT_S)
            await asyncio.sleep(delay)
            delay = min(RECONNECT_MAX_S, delay * 2)


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Hub] = weakref.WeakKeyDictionary()


def subscribe(channels: list[str], accepts=None) -> Subscription:
    """A subscription on the running event loop's hub (one hub, one listener per loop).

    `accepts(offer)` says whether this waiter could take what a publish offers (default: anything).
    """
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is None or hub.task.done():
        hub = _hubs[loop] = _Hub()
    return Subscription(hub, channels, accepts)
