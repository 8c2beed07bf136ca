"""Quiet measurement windows: an agent times only while nothing Kiln controls on its host competes for the cores.

Two host-local lock files, in `quiet_dir()`, are shared by every Kiln process of a host (the `make up`
layout runs the Celery worker and the agent side by side):

- `timing.lock`: an agent holds it exclusively for the length of a timing window, so two agents of
  one host never time at once and a builder can see that an agent wants the cores.
- `builds.lock`: every running build holds it shared. A builder that sees `timing.lock` taken stops
  its build's processes (SIGSTOP), lets go of `builds.lock`, and waits for the window to end before it
  continues them (SIGCONT). The agent takes `builds.lock` exclusively before it times, which it gets
  only once every build of the host has paused (or after `wait_for_builds_s`, when a builder did not).

`flock` locks die with their process, so a crashed agent or worker never leaves a host paused.

Each window records the machine's load before and after (load average, CPU frequency where readable)
and how much CPU other processes took on the agent's cores while it timed; a window where they took
more than the cores the benchmark leaves idle is `busy`, and the caller takes it again
(`measure_quietly`) rather than report it.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil

from devices.environment import env_number

logger = logging.getLogger(__name__)

QUIET_DIR_ENV = "KILN_QUIET_DIR"
BUSY_CORES_ENV = "KILN_AGENT_BUSY_CORES"
RETAKES_ENV = "KILN_AGENT_RETAKES"
TIMING_LOCK = "timing.lock"
BUILDS_LOCK = "builds.lock"
# Held shared by every build of the host from its start to its end, paused or not: an agent can tell that builds wait.
BUILDS_PENDING_LOCK = "builds-pending.lock"
# What the agent holding the timing window times ("local times job 2"), for a paused build to say why it waits.
TIMING_LABEL = "timing.json"
# While builds of this host wait, an agent leaves them at least this share of the time between its windows: a stream of
# device tasks slows the host's builds down, it never stops them (KILN_AGENT_BUILD_SHARE, 0 to 0.9).
BUILD_SHARE_ENV = "KILN_AGENT_BUILD_SHARE"
DEFAULT_BUILD_SHARE = 0.5
# The longest an agent holds back for builds before one window, whatever the last window's length.
MAX_BUILD_TURN_S = 30.0
POLL_S = 0.05
# The kernel counts CPU time in ticks (10 ms): shares over a shorter stretch than this would be mostly rounding.
MIN_ACCOUNTED_S = 0.2
DEFAULT_RETAKES = 2
DEFAULT_WAIT_FOR_BUILDS_S = 120.0
BUSIEST_SHOWN = 3
T = TypeVar("T")


class WindowInterrupted(Exception):
    """`should_stop` answered True while waiting for a quiet window."""


def quiet_dir() -> Path:
    """Where the host's lock files live: KILN_QUIET_DIR, else `$KILN_DATA_DIR/quiet`, else one folder per user in the temp dir."""
    configured = os.environ.get(QUIET_DIR_ENV)
    if configured:
        path = Path(configured)
    elif os.environ.get("KILN_DATA_DIR"):
        path = Path(os.environ["KILN_DATA_DIR"]) / "quiet"
    else:
        path = Path(tempfile.gettempdir()) / f"kiln-quiet-{os.getuid()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _open_lock(name: str, directory: Path | None = None) -> int:
    return os.open((directory or quiet_dir()) / name, os.O_RDWR | os.O_CREAT, 0o600)


def _try_lock(fd: int, mode: int) -> bool:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return True
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise


def _lock_polling(fd: int, mode: int, *, timeout_s: float | None, should_stop: Callable[[], bool] | None) -> bool:
    """Take a lock, checking `should_stop` between tries; False after `timeout_s`."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not _try_lock(fd, mode):
        if should_stop is not None and should_stop():
            raise WindowInterrupted("stopped while waiting for a quiet window")
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def timing_requested(directory: Path | None = None) -> bool:
    """Whether an agent of this host holds (or is about to hold) a timing window."""
    return _held(TIMING_LOCK, fcntl.LOCK_SH, directory)


def timing_label(directory: Path | None = None) -> str:
    """What the agent timing now says it times ("local times job 2"), or "" when unknown."""
    try:
        return json.loads(((directory or quiet_dir()) / TIMING_LABEL).read_text()).get("label", "")[:200]
    except (OSError, ValueError, AttributeError):
        return ""


def _write_timing_label(label: str, directory: Path) -> None:
    with contextlib.suppress(OSError):
        temporary = directory / f".{TIMING_LABEL}.{os.getpid()}"
        temporary.write_text(json.dumps({"label": label, "since": time.time(), "pid": os.getpid()}))
        os.replace(temporary, directory / TIMING_LABEL)


def builds_waiting(directory: Path | None = None) -> bool:
    """Whether a build of this host is running or paused (it holds or waits for the builds lock)."""
    return _held(BUILDS_PENDING_LOCK, fcntl.LOCK_EX, directory)


def _held(name: str, mode: int, directory: Path | None) -> bool:
    """Whether another process holds lock `name` so that this one cannot take it in `mode` now (it is let go at once)."""
    fd = _open_lock(name, directory)
    try:
        if _try_lock(fd, mode):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        return True
    finally:
        os.close(fd)


def build_share() -> float:
    """KILN_AGENT_BUILD_SHARE: the share of time an agent leaves to waiting builds between its windows (default 0.5)."""
    return env_number(BUILD_SHARE_ENV, DEFAULT_BUILD_SHARE, low=0.0, high=0.9)


def builds_turn_s(last_window_s: float, share: float) -> float:
    """How long builds run before the next window so that they get `share` of the time: w * s / (1 - s), capped."""
    if share <= 0 or last_window_s <= 0:
        return 0.0
    return min(MAX_BUILD_TURN_S, last_window_s * share / (1.0 - share))


# -- load -------------------------------------------------------------------------------------

def _cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def _busy_cpu_seconds(cores: list[int]) -> float:
    """CPU seconds spent on `cores` by anything (not idle, not waiting for I/O) since boot."""
    per_cpu = psutil.cpu_times(percpu=True)
    total = 0.0
    for index in cores:
        if index < len(per_cpu):
            times = per_cpu[index]
            total += sum(times) - times.idle - getattr(times, "iowait", 0.0)
    return total


def _own_cpu_seconds() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system + times.children_user + times.children_system


def _cpu_mhz(cores: list[int]) -> float | None:
    """The mean current frequency of `cores` in MHz, where the system says it."""
    readings = []
    for index in cores:
        path = Path(f"/sys/devices/system/cpu/cpu{index}/cpufreq/scaling_cur_freq")
        with contextlib.suppress(OSError, ValueError):
            readings.append(int(path.read_text().strip()) / 1000.0)
    if readings:
        return round(sum(readings) / len(readings), 1)
    with contextlib.suppress(Exception):
        frequency = psutil.cpu_freq()
        if frequency and frequency.current:
            return round(float(frequency.current), 1)
    return None


def _process_cpu() -> dict[tuple[int, float], tuple[str, float]]:
    """CPU seconds so far of every process this user may read, by (pid, start time): a reused pid is another process.

    Empty where the process table cannot be listed (QEMU user-mode emulation with a /proc of its own, a locked-down
    Android): only the names of the busiest processes are lost, not the window's measure of competing CPU (/proc/stat).
    """
    table = {}
    try:
        for process in psutil.process_iter(["name", "cpu_times", "create_time"]):
            times = process.info.get("cpu_times")
            if times is not None:
                table[(process.pid, process.info.get("create_time") or 0.0)] = (process.info.get("name") or "?", times.user + times.system)
    except (psutil.Error, OSError, IndexError) as error:  # psutil.pids() indexes an empty listing
        logger.debug("the process table cannot be read (%s); a busy window will not name its processes", error)
        return {}
    return table


def load_snapshot(cores: list[int] | None = None) -> dict[str, Any]:
    """The machine's load now: load averages and the CPU frequency of the agent's cores (None where unreadable)."""
    cores = cores if cores is not None else _cores()
    try:
        load = [round(value, 2) for value in os.getloadavg()]
    except OSError:
        load = None
    return {"loadavg": load, "cpu_mhz": _cpu_mhz(cores)}


# -- the window -------------------------------------------------------------------------------

@dataclass
class Window:
    """One timing window: when, how long, the load around it, and whether other processes competed for the cores."""

    attempt: int = 1
    started_at: float = 0.0
    seconds: float = 0.0
    waited_s: float = 0.0
    builds_paused: bool = True
    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    competing_cores: float = 0.0
    limit_cores: float = 0.0
    busiest: list[str] = field(default_factory=list)
    retaken: int = 0

    @property
    def busy(self) -> bool:
        return self.competing_cores > self.limit_cores

    def as_dict(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "started_at": round(self.started_at, 3), "seconds": round(self.seconds, 3),
                "waited_s": round(self.waited_s, 3), "builds_paused": self.builds_paused, "before": self.before, "after": self.after,
                "competing_cores": round(self.competing_cores, 3), "limit_cores": round(self.limit_cores, 3), "busy": self.busy,
                "busiest": self.busiest[:BUSIEST_SHOWN], "retaken": self.retaken}


def busy_limit(threads: int | None, cores: list[int] | None = None) -> float:
    """How much CPU (in cores) others may take on the agent's cores before a window is busy: KILN_AGENT_BUSY_CORES, else
    half of what the benchmark's threads leave idle, at least half a core."""
    configured = env_number(BUSY_CORES_ENV, None, low=0.0, unit="cores")
    if configured is not None:
        return configured
    usable = len(cores if cores is not None else _cores())
    spare = max(0, usable - (threads or usable))
    return max(0.5, spare * 0.5)


class QuietWindow:
    """The agent's side: hold the host's timing window, with every build of the host paused, and record the load around it."""

    def __init__(self, *, threads: int | None = None, attempt: int = 1, wait_for_builds_s: float = DEFAULT_WAIT_FOR_BUILDS_S,
                 should_stop: Callable[[], bool] | None = None, directory: Path | None = None, label: str = ""):
        self.directory = directory or quiet_dir()
        self.cores = _cores()
        self.window = Window(attempt=attempt, limit_cores=busy_limit(threads, self.cores))
        self.wait_for_builds_s = wait_for_builds_s
        self.should_stop = should_stop
        self.label = label
        self._fds: list[int] = []

    def __enter__(self) -> Window:
        waiting = time.monotonic()
        self._leave_builds_their_turn()
        timing = _open_lock(TIMING_LOCK, self.directory)
        self._fds.append(timing)
        try:
            _lock_polling(timing, fcntl.LOCK_EX, timeout_s=None, should_stop=self.should_stop)
            if self.label:
                _write_timing_label(self.label, self.directory)
            builds = _open_lock(BUILDS_LOCK, self.directory)
            self._fds.append(builds)
            self.window.builds_paused = _lock_polling(builds, fcntl.LOCK_EX, timeout_s=self.wait_for_builds_s, should_stop=self.should_stop)
        except BaseException:
            self._release()
            raise
        if not self.window.builds_paused:
            logger.warning("a build on this host did not pause within %.0f s; timing anyway (the window's load will show it)",
                           self.wait_for_builds_s)
        self.window.waited_s = time.monotonic() - waiting
        self.window.before = load_snapshot(self.cores)
        self._processes = _process_cpu()
        self._busy = _busy_cpu_seconds(self.cores)
        self._own = _own_cpu_seconds()
        self.window.started_at = time.time()
        self._started = time.monotonic()
        return self.window

    def _leave_builds_their_turn(self) -> None:
        """Before a window: while builds of this host wait, let them run for their share of the time since the last
        window of this host ended (a chain of device tasks slows builds down, it never stops them)."""
        last = _last_window(self.directory)
        if not last or not builds_waiting(self.directory):
            return
        turn = builds_turn_s(float(last.get("seconds") or 0.0), build_share())
        remaining = float(last.get("ended") or 0.0) + turn - time.time()
        deadline = time.monotonic() + max(0.0, min(remaining, turn))
        while time.monotonic() < deadline:
            if self.should_stop is not None and self.should_stop():
                raise WindowInterrupted("stopped while builds had their turn")
            time.sleep(POLL_S)

    def __exit__(self, *exc_info) -> None:
        try:
            _record_window(self.directory, time.monotonic() - self._started)
            self.window.seconds = time.monotonic() - self._started
            wall = max(self.window.seconds, MIN_ACCOUNTED_S)
            others = (_busy_cpu_seconds(self.cores) - self._busy) - (_own_cpu_seconds() - self._own)
            self.window.competing_cores = min(float(len(self.cores)), max(0.0, others / wall))
            self.window.after = load_snapshot(self.cores)
            if self.window.busy:
                self.window.busiest = _busiest(self._processes, _process_cpu(), wall)
        finally:
            self._release()

    def _release(self) -> None:
        for fd in reversed(self._fds):
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        self._fds.clear()


LAST_WINDOW = "last-window.json"


def _record_window(directory: Path, seconds: float) -> None:
    with contextlib.suppress(OSError):
        temporary = directory / f".{LAST_WINDOW}.{os.getpid()}"
        temporary.write_text(json.dumps({"seconds": seconds, "ended": time.time()}))
        os.replace(temporary, directory / LAST_WINDOW)


def _last_window(directory: Path) -> dict:
    try:
        return json.loads((directory / LAST_WINDOW).read_text())
    except (OSError, ValueError):
        return {}


def _busiest(before: dict[tuple[int, float], tuple[str, float]], after: dict[tuple[int, float], tuple[str, float]], wall: float) -> list[str]:
    """The processes that took the most CPU during the window ("name 85%"), excluding this one."""
    own = os.getpid()
    used = []
    for key, (name, seconds) in after.items():
        if key[0] == own:
            continue
        previous = before.get(key)
        # A process that started during the window spent all its time in it.
        share = (seconds - (previous[1] if previous else 0.0)) / wall
        if share >= 0.1:
            used.append((share, f"{name} {share:.0%}"))
    return [text for _, text in sorted(used, reverse=True)[:BUSIEST_SHOWN]]


def retakes_allowed() -> int:
    """How often a busy window is taken again before it is reported as busy: KILN_AGENT_RETAKES (default 2)."""
    return env_number(RETAKES_ENV, DEFAULT_RETAKES, whole=True, low=0, high=10)


def measure_quietly(measure: Callable[[], T], *, threads: int | None = None, should_stop: Callable[[], bool] | None = None,
                    retakes: int | None = None, pause_s: float = 0.5, directory: Path | None = None, label: str = "") -> tuple[T, Window]:
    """Run `measure` inside a quiet window; a busy window is taken again (up to `retakes` times) and the last one kept.

    Returns the measurement and its window (its `retaken` says how many busy windows came before it; `busy`
    whether it is still busy, in which case the caller marks the figure).
    """
    retakes = retakes_allowed() if retakes is None else retakes
    attempt = 0
    while True:
        attempt += 1
        with QuietWindow(threads=threads, attempt=attempt, should_stop=should_stop, directory=directory, label=label) as window:
            result = measure()
        window.retaken = attempt - 1
        if not window.busy or attempt > retakes:
            if window.busy:
                logger.warning("window still busy after %d re-take(s): %.2f cores taken by others (limit %.2f): %s",
                               retakes, window.competing_cores, window.limit_cores, ", ".join(window.busiest) or "unknown")
            return result, window
        logger.info("busy window (%.2f cores taken by others, limit %.2f: %s); taking it again", window.competing_cores,
                    window.limit_cores, ", ".join(window.busiest) or "unknown")
        if should_stop is not None and should_stop():
            raise WindowInterrupted("stopped before a busy window could be taken again")
        time.sleep(pause_s * attempt)


def wait_until_quiet(*, threads: int | None = None, timeout_s: float, should_stop: Callable[[], bool] | None = None,
                     probe_s: float = 1.0, pause_s: float = 2.0, directory: Path | None = None) -> tuple[bool, float]:
    """Before timing that must not be busy: probe the agent's cores in short quiet windows (Kiln's own builds paused, as
    when it times) until other processes take no more than `busy_limit`, or `timeout_s` has passed; (quiet, seconds waited).

    A decision taken on busy rounds is provisional, and the server re-times it with this wait first: load from outside
    Kiln cannot be paused, only waited out. The host's builds run between probes.
    """
    started = time.monotonic()
    while True:
        with QuietWindow(threads=threads, should_stop=should_stop, directory=directory) as window:
            _sleep(probe_s, should_stop)
        waited = time.monotonic() - started
        if not window.busy:
            return True, waited
        if waited >= timeout_s:
            logger.info("the device stayed busy for %.0f s (%.2f cores taken by others: %s); timing anyway", waited,
                        window.competing_cores, ", ".join(window.busiest) or "unknown")
            return False, waited
        _sleep(pause_s, should_stop)


def _sleep(seconds: float, should_stop: Callable[[], bool] | None) -> None:
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if should_stop is not None and should_stop():
            raise WindowInterrupted("stopped while waiting for the device to be quiet")
        time.sleep(min(POLL_S * 4, left))


# -- the builder's side ----------------------------------------------------------------------

class BuildPauser(threading.Thread):
    """Pauses a build's process tree (SIGSTOP) while an agent of this host times, and continues it (SIGCONT) after.

    While the build runs it holds `builds.lock` shared; to pause it lets go, so the waiting agent can
    take the lock exclusively once every running build has stopped. `paused_s` is the time spent
    stopped, which a caller leaves out of the build's time limit.

    `background`: work nobody waits on (an upload's operator-support check at the lowest CPU priority). It pauses
    for windows like any build, but does not count as a build waiting (`builds-pending.lock`): an agent leaves waiting
    builds their turn between windows, and a background check must not make the device idle for a turn it never needs.
    """

    def __init__(self, pid: int, *, directory: Path | None = None, poll_s: float = POLL_S,
                 on_pause: Callable[[str], None] | None = None, on_continue: Callable[[], None] | None = None,
                 background: bool = False):
        super().__init__(daemon=True, name=f"kiln-build-pauser-{pid}")
        self.pid = pid
        self.directory = directory or quiet_dir()
        self.poll_s = poll_s
        self.paused_s = 0.0
        self.pauses = 0
        # Told when the build stops for a window (with what the agent times) and when it goes on: the job says why it waits.
        self.on_pause = on_pause
        self.on_continue = on_continue
        self._pause_started: float | None = None
        self._done = threading.Event()
        self._stopped_tree = False
        self._closed = False
        self._pending = None if background else _open_lock(BUILDS_PENDING_LOCK, self.directory)
        if self._pending is not None:
            fcntl.flock(self._pending, fcntl.LOCK_SH)
        self._builds = _open_lock(BUILDS_LOCK, self.directory)
        # Taken before the child runs a step of its own whenever no agent times: a build that cannot take it starts paused.
        self._holding = not timing_requested(self.directory) and _try_lock(self._builds, fcntl.LOCK_SH)

    def run(self) -> None:
        try:
            if not self._holding:
                self._pause_until_quiet_ends()
            while not self._done.wait(self.poll_s):
                if timing_requested(self.directory):
                    self._pause_until_quiet_ends()
        except psutil.NoSuchProcess:
            pass
        finally:
            self._continue()

    def paused_seconds(self) -> float:
        """Time spent paused so far, the pause going on now included."""
        ongoing = self._pause_started
        return self.paused_s + (time.monotonic() - ongoing if ongoing is not None else 0.0)

    def _pause_until_quiet_ends(self) -> None:
        started = self._pause_started = time.monotonic()
        self._signal(signal.SIGSTOP)
        self._stopped_tree = True
        self.pauses += 1
        self._tell(self.on_pause, timing_label(self.directory))
        # Stopped first, then the lock let go: the agent that takes it next finds nothing of this build running.
        if self._holding:
            fcntl.flock(self._builds, fcntl.LOCK_UN)
            self._holding = False
        # The window is over once no agent asks for one and this build may hold the builds lock again.
        while not self._done.is_set():
            if not timing_requested(self.directory) and _try_lock(self._builds, fcntl.LOCK_SH):
                self._holding = True
                break
            time.sleep(self.poll_s)
        self._continue()
        self.paused_s += time.monotonic() - started
        self._pause_started = None
        self._tell(self.on_continue)

    @staticmethod
    def _tell(callback: Callable | None, *args) -> None:
        if callback is None:
            return
        try:
            callback(*args)
        except Exception:
            logger.exception("a build pause callback failed")

    def _continue(self) -> None:
        if self._stopped_tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                self._signal(signal.SIGCONT)
            self._stopped_tree = False

    def _signal(self, signum: int) -> None:
        root = psutil.Process(self.pid)
        for process in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signum)

    def stop(self) -> None:
        """End the watch: continue the build if it is paused, and let go of the lock."""
        self._done.set()
        if self.is_alive():
            self.join(timeout=5)
        self._continue()
        if self._closed:
            return
        self._closed = True
        for fd in (self._builds, self._pending):
            if fd is None:
                continue
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            with contextlib.suppress(OSError):
                os.close(fd)


def wait_while_timing(*, timeout_s: float = DEFAULT_WAIT_FOR_BUILDS_S, directory: Path | None = None) -> float:
    """Before in-process host work: wait (up to `timeout_s`) while an agent of this host times; returns the seconds waited."""
    started = time.monotonic()
    while timing_requested(directory) and time.monotonic() - started < timeout_s:
        time.sleep(POLL_S)
    return time.monotonic() - started
