"""Memory admission on one host: work starts only when its budget fits beside the others', across processes."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from workers import host_memory


def test_a_booking_that_does_not_fit_waits_until_the_other_ends_and_says_why(tmp_path):
    told: list[str] = []
    first = host_memory.try_book(3000, what="the build of int8 (job 1)", total_mb=4000, directory=tmp_path)
    assert first is not None
    started: list[float] = []

    def second() -> None:
        with host_memory.reserved(2000, what="the build of fp16 (job 2)", total_mb=4000, directory=tmp_path, on_wait=told.append) as waited:
            started.append(waited)

    thread = threading.Thread(target=second)
    thread.start()
    time.sleep(1.5)
    assert not started, "it started while 3000 of 4000 MB were booked"
    host_memory.release(first, tmp_path)
    thread.join(timeout=10)
    assert started and started[0] >= 1.0
    assert told == ["waiting for memory on this host: 1 running (the build of int8 (job 1)) hold 3000 of 4000 MB, this needs 2000 MB"]
    assert host_memory.booked(tmp_path) == []


def test_a_lone_booking_always_fits_even_over_the_total(tmp_path):
    with host_memory.reserved(9000, what="a big build", total_mb=4000, directory=tmp_path) as waited:
        assert waited < 1.0
        assert [entry["megabytes"] for entry in host_memory.booked(tmp_path)] == [9000]


def test_a_booking_of_a_process_that_died_no_longer_counts(tmp_path):
    code = ("import sys; from pathlib import Path; from workers import host_memory; "
            f"host_memory.try_book(3500, what='killed', total_mb=4000, directory=Path({str(tmp_path)!r})); sys.exit(0)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert host_memory.booked(tmp_path) == []  # its process is gone
    assert host_memory.try_book(3500, what="next", total_mb=4000, directory=tmp_path) is not None


def test_the_host_total_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv(host_memory.HOST_MEMORY_ENV, "12000")
    assert host_memory.host_memory_mb() == 12000
    monkeypatch.setenv(host_memory.HOST_MEMORY_ENV, "lots")
    with pytest.raises(ValueError, match="KILN_HOST_MEMORY_MB"):
        host_memory.host_memory_mb()


def test_work_started_inside_a_request_waits_only_briefly_then_runs(tmp_path):
    first = host_memory.try_book(3000, what="a build", total_mb=4000, directory=tmp_path)
    token = host_memory.MAX_WAIT_S.set(0.5)
    try:
        started = time.monotonic()
        with host_memory.reserved(2000, what="an upload", total_mb=4000, directory=tmp_path) as waited:
            assert 0.5 <= waited < 5 and time.monotonic() - started < 5
    finally:
        host_memory.MAX_WAIT_S.reset(token)
        host_memory.release(first, tmp_path)
