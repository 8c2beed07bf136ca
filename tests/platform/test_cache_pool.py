"""Django's cache on Redis: every request's cache object uses the process's one connection pool."""
from __future__ import annotations

import os
import threading

import pytest
from django.core.cache.backends.redis import RedisCache

REDIS_URL = os.environ.get("REDIS_URL", "")
OPTIONS = {"OPTIONS": {"pool_class": "kiln.core.cache.SharedConnectionPool"}, "KEY_PREFIX": "kiln-test-cache-pool"}


@pytest.mark.skipif(not REDIS_URL, reason="needs REDIS_URL (a real Redis)")
def test_cache_objects_in_many_threads_share_one_pool_and_one_connection():
    pools, errors = [], []

    def one_request(index: int) -> None:
        # Django makes a cache object per request context; each used to open its own connection.
        cache = RedisCache(REDIS_URL, OPTIONS)
        try:
            cache.set(f"key-{index}", index, timeout=30)
            assert cache.get(f"key-{index}") == index
            pools.append(cache._cache._get_connection_pool(write=True))
        except Exception as exc:  # surfaced below: an assert in a thread does not fail the test
            errors.append(exc)

    for index in range(8):
        thread = threading.Thread(target=one_request, args=(index,))
        thread.start()
        thread.join()

    assert not errors
    assert len({id(pool) for pool in pools}) == 1
    # One after another, the requests reused one connection instead of opening eight.
    pool = pools[0]
    assert len(pool._available_connections) + len(pool._in_use_connections) == 1


def test_settings_give_the_redis_cache_the_shared_pool(settings):
    from kiln import settings as kiln_settings  # the module as configured from the environment

    if not kiln_settings.REDIS_URL:
        pytest.skip("the cache is on files without REDIS_URL")
    assert kiln_settings.CACHES["default"]["OPTIONS"]["pool_class"] == "kiln.core.cache.SharedConnectionPool"
