"""What a token stands for, remembered in this process behind the token's digest for a while.

Every authenticated call presents a token; looking it up is a database query, and agents and
scripts call all the time. Entries are keyed by the token's HMAC digest (never the secret), live a
bounded time and the cache holds a bounded number of them (the oldest go first).

An entry carries tags (an agent id, a token id, a user's membership...). Forgetting a tag drops
every entry that carries it at once in this process, and a lookup that began before the forget
does not remember its (stale) row afterwards.

Other server processes, on this host or another, learn of a revocation through `generation`: a
value in the shared cache that every revocation changes (kiln.core.revocations). An entry remembers
the generation read before its row was; a `get` whose current generation differs (or cannot be
read) is a miss, so a revocation takes effect on every process with its next request. Reading it is
one Redis GET (or a file stat without Redis) per cache hit: far cheaper than the query it spares.

An entry lives a random 50-100 % of the period: a fleet that enrolled within a few seconds would
otherwise have all its tokens expire within the same few seconds, every period, and the lookups of
1,000 agents queue up behind one another (seconds of heartbeat and lease latency).
"""
from __future__ import annotations

import copy
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, NamedTuple, TypeVar

Value = TypeVar("Value")

MAX_ENTRIES = 20_000


class Lookup(NamedTuple):
    """When a database lookup began (monotonic) and the revocation generation then (None: unknown)."""

    at: float
    generation: Hashable | None


class DigestCache(Generic[Value]):
    """Values behind token digests, each for a random 50-100 % of `ttl()` seconds (0: not cached).

    `copier` copies a value on the way in and out: a request may change the attributes of what it
    got; the remembered one stays as read. `generation()`, when given, is the shared revocation
    generation: an entry read under another one (or when it cannot be read, None) is not used.
    """

    def __init__(self, ttl: Callable[[], float], copier: Callable[[Value], Value] = copy.copy, max_entries: int = MAX_ENTRIES,
                 generation: Callable[[], Hashable | None] | None = None):
        self._ttl = ttl
        self._copy = copier
        self._max_entries = max_entries
        self._generation = generation
        self._lock = threading.Lock()
        # digest -> (expires at, monotonic; tags; the value as read then; the generation then). Oldest first, for eviction.
        self._entries: OrderedDict[str, tuple[float, frozenset, Value, Hashable | None]] = OrderedDict()
        # tag -> when it was forgotten: a lookup that began before then must not remember it again.
        self._forgotten: dict[Hashable, float] = {}

    def lookup_started(self) -> Lookup:
        """Call before reading from the database; pass the value to `remember`."""
        return Lookup(time.monotonic(), self._generation() if self._generation is not None else None)

    def get(self, digest: str) -> Value | None:
        """A copy of the value remembered for this digest, or None (unknown, expired, or read before a revocation)."""
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                return None
            if entry[0] <= now:
                del self._entries[digest]
                return None
        if self._generation is not None:
            current = self._generation()
            if current is None or current != entry[3]:
                with self._lock:
                    if self._entries.get(digest) is entry:
                        del self._entries[digest]
                return None
        return self._copy(entry[2])

    def remember(self, digest: str, value: Value, tags: Iterable[Hashable], looked_up_at: Lookup) -> None:
        """Remember a value read since `looked_up_at`, unless one of its tags was forgotten since."""
        ttl = self._ttl()
        if ttl <= 0 or (self._generation is not None and looked_up_at.generation is None):
            return
        tags = frozenset(tags)
        with self._lock:
            if any(self._forgotten.get(tag, float("-inf")) >= looked_up_at.at for tag in tags):
                return
            self._entries[digest] = (time.monotonic() + ttl * random.uniform(0.5, 1.0), tags, self._copy(value), looked_up_at.generation)
            self._entries.move_to_end(digest)
            while len(self._entries) > self._max_entries:
                self._entries.popitem(last=False)

    def update(self, digest: str, change: Callable[[Value], None]) -> None:
        """Apply `change` to the remembered value in place (if any), keeping its expiry."""
        with self._lock:
            entry = self._entries.get(digest)
            if entry is not None:
                change(entry[2])

    def forget(self, tag: Hashable) -> None:
        """Drop every entry carrying this tag (revoked, changed), and refuse older lookups of it."""
        now = time.monotonic()
        with self._lock:
            for digest in [d for d, (_, tags, _, _) in self._entries.items() if tag in tags]:
                del self._entries[digest]
            self._forgotten[tag] = now
            # A lookup lasts far less than a period: older marks can go.
            horizon = now - max(60.0, 2 * self._ttl())
            for stale in [t for t, at in self._forgotten.items() if at < horizon]:
                del self._forgotten[stale]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._forgotten.clear()
