"""Fuzzing every upload parser for a bounded time: no input makes a 500, and memory stays bounded.

The harness (tests/fuzz_uploads.py) is shared with `benchmarks/fuzz_uploads.py --minutes N`, which runs this module
with KILN_FUZZ_MINUTES set: each target then draws fresh examples until its share of the time is spent and prints
what it ran. Without it (CI) each target gets a fixed, small number of examples, derandomized so that a run is
repeatable: the web-side parsers a hundred and fifty, the API a handful, since each API example parses in the OS
sandbox.
"""
from __future__ import annotations

import os
import time
from collections import Counter

import psutil
import pytest
from hypothesis import HealthCheck, given, settings

from tests.fuzz_uploads import HTTP, INLINE, check_http, check_inline, warm_seeds

pytestmark = pytest.mark.timeout(None if os.environ.get("KILN_FUZZ_MINUTES") else 300)
MINUTES = float(os.environ.get("KILN_FUZZ_MINUTES") or 0)
INLINE_EXAMPLES = 150
# Refused before any sandbox starts (headers, an archive's checks): cheap. The others each start one (a PyTorch
# export takes seconds).
HTTP_EXAMPLES = {"tus headers": 25, "zipped onnx model": 6, "torch.export .pt2": 2, "torchscript .pt": 2}
SANDBOXED_EXAMPLES = 3
# What the web process may grow by over one target's examples: a leak or an unbounded buffer shows well above it.
MAX_GROWTH_MB = 256
QUIET = {"deadline": None, "database": None, "suppress_health_check": list(HealthCheck)}


def fuzz(name: str, strategy, body, examples: int) -> Counter:
    """Run `body` on examples of `strategy`: `examples` of them, derandomized, or (KILN_FUZZ_MINUTES) fresh ones for
    this target's share of the time. Returns what the bodies answered, counted."""
    seen: Counter = Counter()

    def counted(value):
        seen[body(value)] += 1

    if not MINUTES:
        settings(max_examples=examples, derandomize=True, **QUIET)(given(strategy)(counted))()
        return seen
    share_s = MINUTES * 60 / (len(INLINE) + len(HTTP))
    ends = time.monotonic() + share_s
    while time.monotonic() < ends:
        settings(max_examples=max(examples, 20), **QUIET)(given(strategy)(counted))()
    print(f"\n{name}: {sum(seen.values())} examples in {share_s:.0f} s, answers {dict(sorted(seen.items(), key=str))}")
    return seen


@pytest.mark.parametrize("name", sorted(INLINE))
def test_a_web_side_parser_answers_any_input_with_a_4xx_at_worst(name):
    def body(value):
        check_inline(name, value)
        return "ok"

    fuzz(name, INLINE[name].strategy(), body, INLINE_EXAMPLES)


@pytest.mark.django_db
@pytest.mark.parametrize("name", sorted(HTTP))
def test_an_upload_never_gets_a_500_and_the_server_does_not_grow(name, tenant, settings, tmp_path):
    settings.BLOB_ROOT = tmp_path / "blobs"
    settings.UPLOAD_TMP_DIR = tmp_path / "uploads"
    warm_seeds()
    before = psutil.Process().memory_info().rss
    fuzz(name, HTTP[name].strategy(), lambda value: check_http(name, tenant.client, value), HTTP_EXAMPLES.get(name, SANDBOXED_EXAMPLES))
    grown_mb = (psutil.Process().memory_info().rss - before) / (1 << 20)
    if MINUTES:
        print(f"{name}: the web process grew by {grown_mb:.0f} MB")
    assert grown_mb < MAX_GROWTH_MB, f"{name}: the web process grew by {grown_mb:.0f} MB"
