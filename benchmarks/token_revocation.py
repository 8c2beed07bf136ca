"""What immediate revocation costs a cached token check: the revocation generation read per cache hit.

Side by side, interleaved in rounds, in one process: a token-cache hit without the generation check
(the old behaviour, where a revocation reached other processes only when their entry expired), a
hit that reads the generation from Redis (REDIS_URL), one that reads it from the embedded default's
file, and, for scale, one database round trip (`SELECT 1`), the least a cache miss costs. Prints the
median microseconds per call and the ratios.

    DATABASE_URL=postgres://... REDIS_URL=redis://... python benchmarks/token_revocation.py
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kiln.settings")

import django

django.setup()

from django.conf import settings
from django.db import connection

from kiln.core import notify
from kiln.core.token_cache import DigestCache

CALLS = 2000
ROUNDS = 15


def cache_with(generation) -> DigestCache:
    cache = DigestCache(lambda: 3600, generation=generation)
    cache.remember("digest", {"agent": 1}, (1,), cache.lookup_started())
    assert cache.get("digest") is not None
    return cache


def files_generation():
    saved = settings.REDIS_URL
    settings.REDIS_URL = ""
    try:
        return notify.generation("revocations")
    finally:
        settings.REDIS_URL = saved


def per_call_us(call) -> float:
    started = time.perf_counter()
    for _ in range(CALLS):
        call()
    return (time.perf_counter() - started) / CALLS * 1e6


def main() -> None:
    settings.DATA_DIR = Path(tempfile.mkdtemp(prefix="kiln-bench-"))
    contenders = {"hit, no generation (before)": cache_with(None).get}
    files = cache_with(files_generation)
    contenders["hit + generation from a file (embedded)"] = files.get
    if settings.REDIS_URL:
        contenders["hit + generation from Redis"] = cache_with(lambda: notify.generation("revocations")).get
    if connection.vendor == "postgresql":
        def select_one():
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
        contenders["one PostgreSQL round trip (a miss costs more)"] = select_one
    samples = {name: [] for name in contenders}
    for _ in range(ROUNDS):
        for name, call in contenders.items():
            samples[name].append(per_call_us(lambda call=call: call("digest") if call.__name__ == "get" else call()))
    base = statistics.median(samples["hit, no generation (before)"])
    print(f"load average {os.getloadavg()[0]:.1f}; {ROUNDS} interleaved rounds of {CALLS} calls")
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"{name:50s} {median:8.1f} us/call  {median / base:6.1f}x the plain hit")


if __name__ == "__main__":
    main()
