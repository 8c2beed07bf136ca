"""The agent's main loop: a long-poll for tasks that runs each one, and heartbeats while one runs.

An idle agent sends nothing but its long-polls: the server counts each as a heartbeat and answers
with the intervals to use. A heartbeat goes out only while a task runs (its answer says whether to
cancel it).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from pathlib import Path

from devices.agent.capabilities import collect_capabilities
from devices.agent.client import AgentClient, AgentUnauthorized, ApiError, ServerUnavailable
from devices.agent.config import AgentConfig
from devices.agent.runner import TaskRunner

logger = logging.getLogger(__name__)

ERROR_BACKOFF_BASE_S = 1.0
ERROR_BACKOFF_CAP_S = 60.0


class StopRequested(BaseException):
    """Raised by the signal handler to break out of an idle long-poll."""


def jittered(seconds: float, fraction: float = 0.10) -> float:
    """`seconds` ± `fraction`, so that a fleet does not call in step."""
    return max(0.0, seconds * random.uniform(1.0 - fraction, 1.0 + fraction))


class Agent:
    """A registered agent working until it is stopped."""

    def __init__(
        self,
        config: AgentConfig,
        work_dir: Path,
        *,
        client: AgentClient | None = None,
        threads: int | None = None,
    ):
        self.config = config
        self.client = client or AgentClient(config.server, config.agent_token)
        self.stop_event = threading.Event()
        self.runner = TaskRunner(self.client, Path(work_dir), stop_event=self.stop_event, threads=threads)
        self.runner.agent_name = config.name
        self.heartbeat_interval_s = float(config.heartbeat_interval_s or 15.0)
        self.long_poll_s = float(config.long_poll_s or 20.0)
        self.poll_interval_s = float(config.poll_interval_s or 1.0)
        self.capabilities = collect_capabilities()
        self.unauthorized: AgentUnauthorized | None = None
        self._lock = threading.Lock()
        self._running_task: int | None = None
        self._cancel: threading.Event | None = None
        self._idle = True

    # -- signals -------------------------------------------------------------------------------

    def request_stop(self, *, interrupt_idle: bool = False) -> None:
        """Ask the agent to stop; from a signal handler, also break an idle long-poll."""
        first = not self.stop_event.is_set()
        self.stop_event.set()
        if first:
            logger.info("stopping: %s", "finishing or handing back the current task"
                        if not self._idle else "no task running")
        if interrupt_idle and self._idle:
            raise StopRequested()

    # -- heartbeat -----------------------------------------------------------------------------

    def heartbeat_once(self) -> None:
        with self._lock:
            running = self._running_task
        answer = self.client.heartbeat(capabilities=self.capabilities, running_task=running)
        self._follow_intervals(answer)
        canceled = {str(task_id) for task_id in answer.get("cancel") or []}
        with self._lock:
            if self._running_task is not None and str(self._running_task) in canceled:
                logger.info("heartbeat: task %s canceled by the server", self._running_task)
                self._cancel.set()

    def _follow_intervals(self, intervals: dict) -> None:
        """Take the intervals the server chose (from a heartbeat's body or a lease answer's headers)."""
        for name in ("heartbeat_interval_s", "long_poll_s", "poll_interval_s"):
            if intervals.get(name):
                setattr(self, name, float(intervals[name]))

    def _heartbeat_loop(self) -> None:
        while not self.stop_event.wait(jittered(self.heartbeat_interval_s)):
            with self._lock:
                if self._running_task is None:
                    # Idle: the open long-poll is the heartbeat.
                    continue
            try:
                self.heartbeat_once()
            except AgentUnauthorized as exc:
                self.unauthorized = exc
                logger.error("heartbeat refused (401): %s", exc.message)
                self.stop_event.set()
                with self._lock:
                    if self._cancel is not None:
                        self._cancel.set()
                return
            except (ApiError, ServerUnavailable) as exc:
                logger.warning("heartbeat failed: %s", exc)
            except Exception:
                logger.exception("heartbeat failed")

    # -- main loop -----------------------------------------------------------------------------

    def run(self, *, once: bool = False) -> int:
        """Work until stopped (or, with `once`, until one task was handled); return the exit code:
        0 on a requested stop, 3 when the server refuses the agent's token."""
        try:
            self.heartbeat_once()
        except AgentUnauthorized as exc:
            return self._unauthorized(exc)
        except (ApiError, ServerUnavailable, StopRequested) as exc:
            if isinstance(exc, StopRequested):
                return 0
            logger.warning("first heartbeat failed: %s", exc)
        heartbeat = threading.Thread(target=self._heartbeat_loop, name="kiln-heartbeat", daemon=True)
        heartbeat.start()
        errors = 0
        try:
            while not self.stop_event.is_set():
                try:
                    handled = self._poll_and_run()
                    errors = 0
                except AgentUnauthorized as exc:
                    return self._unauthorized(exc)
                except (ApiError, ServerUnavailable) as exc:
                    errors += 1
                    wait_s = random.uniform(0, min(ERROR_BACKOFF_CAP_S, ERROR_BACKOFF_BASE_S * 2**errors))
                    wait_s = max(wait_s, jittered(self.poll_interval_s))
                    logger.warning("lease failed: %s; polling again in %.1f s", exc, wait_s)
                    self.stop_event.wait(wait_s)
                    continue
                if once and handled:
                    break
        except StopRequested:
            pass
        finally:
            self._idle = False
            self.stop_event.set()
            heartbeat.join(timeout=5)
        if self.unauthorized is not None:
            return self._unauthorized(self.unauthorized)
        logger.info("agent stopped")
        return 0

    def _unauthorized(self, exc: AgentUnauthorized) -> int:
        logger.error(
            "the server refused this agent's token (401: %s). It was revoked or is wrong: "
            "register the agent again with `kiln-agent register`.", exc.message,
        )
        self.stop_event.set()
        return 3

    def _poll_and_run(self) -> bool:
        """Long-poll once; run the task if one came. Returns whether a task was handled."""
        # Up to 10 % shorter than the server's long-poll: a fleet that started together drifts apart.
        wait_s = round(self.long_poll_s * random.uniform(0.9, 1.0), 2)
        started = time.monotonic()
        self._idle = True
        try:
            if self.stop_event.is_set():
                return False
            task = self.client.lease(wait_s=wait_s)
        finally:
            self._idle = False
        self._follow_intervals(getattr(self.client, "intervals", None) or {})
        if task is None:
            # A server that answers 204 well before wait_s does not long-poll: pace ourselves.
            if time.monotonic() - started < wait_s / 2:
                self.stop_event.wait(jittered(self.poll_interval_s))
            return False
        cancel = threading.Event()
        with self._lock:
            self._running_task, self._cancel = task["id"], cancel
        try:
            logger.info("leased task %s (attempt %s, backend %s)",
                        task["id"], task.get("attempt"), task.get("backend"))
            if self.stop_event.is_set():
                # A stop raced with the lease: give the task straight back.
                try:
                    self.client.result(task["id"], TaskRunner._hand_back(task))
                except (ApiError, ServerUnavailable) as exc:
                    if isinstance(exc, AgentUnauthorized):
                        raise
                    logger.warning("could not hand task %s back: %s", task["id"], exc)
                return True
            self.runner.run(task, cancel)
        finally:
            with self._lock:
                self._running_task, self._cancel = None, None
            self._idle = True
        return True
