"""kiln.core.token_cache: bounded, per digest, and a forget wins over a lookup that began before it."""
from __future__ import annotations

from kiln.core.token_cache import DigestCache


def test_the_oldest_entries_go_first_beyond_the_bound():
    cache = DigestCache(lambda: 3600, max_entries=3)
    for number in range(5):
        cache.remember(f"digest-{number}", {"n": number}, (number,), cache.lookup_started())
    assert [cache.get(f"digest-{n}") for n in range(5)] == [None, None, {"n": 2}, {"n": 3}, {"n": 4}]


def test_a_forget_drops_every_entry_with_the_tag_and_refuses_older_lookups():
    cache = DigestCache(lambda: 3600)
    began = cache.lookup_started()
    cache.remember("a", "first token", (("user", 1), ("token", 1)), began)
    cache.remember("b", "second token", (("user", 1), ("token", 2)), began)
    cache.remember("c", "another user's", (("user", 2), ("token", 3)), began)
    cache.forget(("user", 1))
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (None, None, "another user's")
    cache.remember("a", "read before the revocation", (("user", 1), ("token", 1)), began)
    assert cache.get("a") is None
    cache.remember("a", "read after it", (("user", 1), ("token", 1)), cache.lookup_started())
    assert cache.get("a") == "read after it"


def test_a_period_of_zero_remembers_nothing_and_copies_go_out():
    off = DigestCache(lambda: 0)
    off.remember("a", [1], (1,), off.lookup_started())
    assert off.get("a") is None
    on = DigestCache(lambda: 3600)
    on.remember("a", [1], (1,), on.lookup_started())
    on.get("a").append(2)
    assert on.get("a") == [1]


def test_an_entry_read_under_an_older_revocation_generation_is_not_used():
    """Another process revoked something: the shared generation changed, every older entry is a miss."""
    shared = {"generation": "g1"}
    cache = DigestCache(lambda: 3600, generation=lambda: shared["generation"])
    cache.remember("a", "token a", (1,), cache.lookup_started())
    assert cache.get("a") == "token a"
    began = cache.lookup_started()  # a lookup that began before the revocation...
    shared["generation"] = "g2"
    assert cache.get("a") is None
    cache.remember("b", "read before it", (2,), began)  # ...remembers what it read under g1
    assert cache.get("b") is None
    cache.remember("b", "read after it", (2,), cache.lookup_started())
    assert cache.get("b") == "read after it"


def test_without_a_readable_generation_nothing_is_trusted():
    shared = {"generation": "g1"}
    cache = DigestCache(lambda: 3600, generation=lambda: shared["generation"])
    cache.remember("a", "token a", (1,), cache.lookup_started())
    shared["generation"] = None  # Redis unreachable
    assert cache.get("a") is None
    cache.remember("a", "token a", (1,), cache.lookup_started())
    shared["generation"] = "g1"
    assert cache.get("a") is None
