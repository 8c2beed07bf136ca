"""Work classes: which Celery queue each task goes to, how a host sizes each class, and the worker that serves it.

Three classes, each on its own queue and its own worker, so that one class never waits behind another:

- `control`: stage transitions, dispatch, collect, report and housekeeping. Short, database-only steps: a job whose
  devices finished goes on at once, whatever the builds are doing.
- `build`: anything that reads a model to make something (validate, convert, the FP32 reference, planning a round,
  variant builds). As many at once as the host has cores and build memory budgets (`build_slots`).
- `check`: sandboxed loads and operator-support checks of uploads. Their own slots, so a hostile upload that runs a
  check to its limit holds a check slot, never a build or a control step.

Fairness inside a class is Celery's own: message priorities (`priority_for`), per-organization limits checked when a
task starts (kiln.pipeline.capacity), and retries that put a refused task back on its queue.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

CONTROL, BUILD, CHECK = "control", "build", "check"
WORK_CLASSES = (CONTROL, BUILD, CHECK)
# Messages sent before the classes existed went to one queue of this name; the control worker drains it.
LEGACY_QUEUE = "kiln"

# Task name -> work class. Names, not imports: the pipeline owns the tasks and imports this module.
TASK_CLASSES = {
    "kiln.job.validate": BUILD,
    "kiln.job.convert": BUILD,
    "kiln.job.reference": BUILD,
    "kiln.job.quantize": BUILD,
    "kiln.job.plan": BUILD,
    "kiln.variant.build": BUILD,
    "kiln.job.support": CHECK,
    "kiln.model.operator_support": CHECK,
    "kiln.job.dispatch": CONTROL,
    "kiln.job.collect": CONTROL,
    "kiln.job.report": CONTROL,
}
HOUSEKEEPING_PREFIX = "kiln.housekeeping."

# Celery's Redis transport keeps one list per priority step; 0 is served first. Ten steps: a job's tenth queued build
# still goes behind another job's first.
PRIORITY_STEPS = list(range(10))
LOWEST_PRIORITY = PRIORITY_STEPS[-1]
# Each this many builds a job (or an organization) already has waiting or running, its next one goes a step back.
BUILDS_PER_PRIORITY_STEP = 2
ORGANIZATION_BUILDS_PER_PRIORITY_STEP = 4


def work_class_of(task_name: str) -> str:
    """The class of a task by its registered name; housekeeping and anything unknown is control."""
    if task_name.startswith(HOUSEKEEPING_PREFIX):
        return CONTROL
    return TASK_CLASSES.get(task_name, CONTROL)


def task_routes() -> dict[str, dict[str, str]]:
    """Celery's `task_routes`: every task to its class's queue."""
    routes = {name: {"queue": work_class} for name, work_class in TASK_CLASSES.items()}
    routes[HOUSEKEEPING_PREFIX + "*"] = {"queue": CONTROL}
    return routes


def priority_for(*, job_builds_ahead: int, organization_builds_ahead: int) -> int:
    """A message's priority (0 first) from what its job and its organization already have waiting or running: a job's
    first builds go ahead of another job's tenth, and a quiet organization's ahead of a busy one's."""
    steps = job_builds_ahead // BUILDS_PER_PRIORITY_STEP + organization_builds_ahead // ORGANIZATION_BUILDS_PER_PRIORITY_STEP
    return min(LOWEST_PRIORITY, max(0, steps))


def physical_memory_mb() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1024 * 1024))
    except (ValueError, OSError, AttributeError):
        return 8192


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def build_slots(*, cores: int, host_memory_mb: int, build_memory_mb: int) -> int:
    """Builds one host runs at once: one per core, and no more than the host's memory holds at the build budget."""
    return max(1, min(cores, host_memory_mb // max(1, build_memory_mb)))


def check_slots(*, cores: int, host_memory_mb: int, check_memory_mb: int) -> int:
    """Sandboxed checks one host runs at once: two where cores and memory allow (one organization's check never holds
    the only one), at most one per core."""
    return max(1, min(2, cores, host_memory_mb // max(1, check_memory_mb)))


def all_queues() -> list[str]:
    """Every queue, for one worker that serves all classes (tests, a minimal host)."""
    return [*WORK_CLASSES, LEGACY_QUEUE]


def worker_command(work_class: str, *, concurrency: int, beat_schedule: Path | None = None, pool: str | None = None,
                   extra: tuple[str, ...] = ()) -> list[str]:
    """The Celery worker that serves one work class (the control worker also drains the legacy queue and, given a
    schedule file, runs the housekeeping beat)."""
    queues = [work_class, LEGACY_QUEUE] if work_class == CONTROL else [work_class]
    command = [sys.executable, "-m", "celery", "-A", "workers.celery", "worker", "--loglevel", "INFO", "--queues", ",".join(queues),
               "--concurrency", str(concurrency), "--hostname", f"{work_class}@%h", *extra]
    if pool:
        command += ["--pool", pool]
    if beat_schedule is not None:
        command += ["--beat", "--schedule", str(beat_schedule)]
    return command
