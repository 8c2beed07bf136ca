"""Memory admission on one host: a build or a sandbox starts only when its memory budget fits beside the others'.

Every Kiln process of a host that starts memory-bounded work (a variant build, a sandboxed check or export) writes
its budget into one ledger (`memory.json` in the host's quiet folder, devices/quiet.py) under a lock, and takes it out
when the work ends. An entry whose process is gone no longer counts, so a killed worker never leaves memory booked.
Work that does not fit waits, saying why (`on_wait`), until it does or `wait_s` passes (then it runs anyway, with a
warning: a budget that can never fit must not hold a job forever).

One build's own budget (`KILN_BUILD_MEMORY_MB`, `build_memory_mb`) is read here too: the build sandbox books it and
stops a build at it (workers.quantize.isolated), and calibration plans its working set within it (workers.quantize.streaming).
"""
from __future__ import annotations

import contextlib
import contextvars
import fcntl
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from devices.environment import env_number
from devices.quiet import quiet_dir
from workers.routing import physical_memory_mb

logger = logging.getLogger(__name__)

HOST_MEMORY_ENV = "KILN_HOST_MEMORY_MB"
# What one variant build may hold (workers/quantize/isolated.py stops a build past it); the build slots and the ledger
# count builds at this size.
BUILD_MEMORY_ENV = "KILN_BUILD_MEMORY_MB"
DEFAULT_BUILD_MEMORY_MB = 4096
LEDGER = "memory.json"
LEDGER_LOCK = "memory.lock"
# What Kiln's bounded work may book of the machine's memory when KILN_HOST_MEMORY_MB is unset: the rest is for the
# web server, the workers themselves, the database and the agents.
DEFAULT_SHARE = 0.8
POLL_S = 1.0
DEFAULT_WAIT_S = 1800.0
# How long work started here waits for memory at most: a build in a worker may wait its turn, an upload read inside its
# HTTP request may not (kiln.registry.services.upload_check_slot sets it short there).
MAX_WAIT_S: contextvars.ContextVar[float] = contextvars.ContextVar("kiln_host_memory_max_wait_s", default=DEFAULT_WAIT_S)


@dataclass(frozen=True)
class Booking:
    token: str
    pid: int
    started: float
    megabytes: int
    what: str

    def as_dict(self) -> dict:
        return {"token": self.token, "pid": self.pid, "started": self.started, "megabytes": self.megabytes, "what": self.what}


def host_memory_mb() -> int:
    """What bounded work may book on this host, in MB: KILN_HOST_MEMORY_MB, else 80% of physical memory."""
    configured = env_number(HOST_MEMORY_ENV, None, whole=True, low=256, unit="megabytes", unset=("", "0"))
    return configured if configured is not None else int(physical_memory_mb() * DEFAULT_SHARE)


def build_memory_mb() -> int:
    """The budget of one variant build, in MB (its process tree's resident memory): KILN_BUILD_MEMORY_MB, default 4096."""
    return env_number(BUILD_MEMORY_ENV, DEFAULT_BUILD_MEMORY_MB, whole=True, low=256, unit="megabytes")


def _alive(entry: dict) -> bool:
    try:
        process = psutil.Process(int(entry["pid"]))
        # A reused pid belongs to a process that started after the booking.
        return process.create_time() <= float(entry["started"]) + 1.0
    except (psutil.Error, KeyError, ValueError, TypeError):
        return False


@contextlib.contextmanager
def _ledger(directory: Path | None) -> Iterator[dict]:
    folder = directory or quiet_dir()
    fd = os.open(folder / LEDGER_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        path = folder / LEDGER
        try:
            entries = json.loads(path.read_text()) if path.exists() else []
        except (OSError, ValueError):
            entries = []
        state = {"entries": [entry for entry in entries if isinstance(entry, dict) and _alive(entry)]}
        yield state
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(state["entries"]))
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def booked(directory: Path | None = None) -> list[dict]:
    """What live work has booked on this host now."""
    with _ledger(directory) as state:
        return list(state["entries"])


def try_book(megabytes: int, *, what: str, total_mb: int | None = None, directory: Path | None = None) -> Booking | None:
    """Book `megabytes` if they fit beside what is booked (a lone booking always fits); None when they do not."""
    total = total_mb if total_mb is not None else host_memory_mb()
    with _ledger(directory) as state:
        used = sum(int(entry.get("megabytes") or 0) for entry in state["entries"])
        if state["entries"] and used + megabytes > total:
            return None
        booking = Booking(uuid.uuid4().hex, os.getpid(), psutil.Process().create_time(), int(megabytes), what[:200])
        state["entries"].append(booking.as_dict())
        return booking


def release(booking: Booking, directory: Path | None = None) -> None:
    with _ledger(directory) as state:
        state["entries"] = [entry for entry in state["entries"] if entry.get("token") != booking.token]


def waiting_reason(megabytes: int, *, total_mb: int | None = None, directory: Path | None = None) -> str:
    """Why `megabytes` do not fit now: "waiting for memory: 2 builds hold 8192 of 12000 MB (needs 4096)"."""
    total = total_mb if total_mb is not None else host_memory_mb()
    entries = booked(directory)
    used = sum(int(entry.get("megabytes") or 0) for entry in entries)
    holders = ", ".join(sorted({str(entry.get("what") or "?") for entry in entries})[:3])
    return f"waiting for memory on this host: {len(entries)} running ({holders}) hold {used} of {total} MB, this needs {megabytes} MB"


@contextlib.contextmanager
def reserved(megabytes: int, *, what: str, on_wait: Callable[[str], None] | None = None, wait_s: float | None = None,
             total_mb: int | None = None, directory: Path | None = None) -> Iterator[float]:
    """Hold `megabytes` of the host's memory for the body; wait (calling `on_wait` once with the reason) until they fit,
    at most `wait_s` (default: MAX_WAIT_S of this context). Yields the seconds waited."""
    wait_s = MAX_WAIT_S.get() if wait_s is None else wait_s
    started = time.monotonic()
    told = False
    booking = try_book(megabytes, what=what, total_mb=total_mb, directory=directory)
    while booking is None:
        if not told:
            told = True
            reason = waiting_reason(megabytes, total_mb=total_mb, directory=directory)
            logger.info("%s: %s", what, reason)
            if on_wait is not None:
                on_wait(reason)
        if time.monotonic() - started > wait_s:
            logger.warning("%s waited %.0f s for memory; starting anyway", what, wait_s)
            break
        time.sleep(POLL_S)
        booking = try_book(megabytes, what=what, total_mb=total_mb, directory=directory)
    try:
        yield time.monotonic() - started
    finally:
        if booking is not None:
            release(booking, directory)
