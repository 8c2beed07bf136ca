"""The CPUs this process may run on: the machine's cores, less those its affinity mask (taskset, a cpuset
container) keeps it off. An agent confined to one core reports one core and runs one intra-op thread there,
which is also what ONNX Runtime itself picks by default."""

from __future__ import annotations

import os

import psutil


def usable_logical_cores() -> int:
    """Logical CPUs in this process's affinity mask (all of them where the OS has no masks)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return psutil.cpu_count(logical=True) or os.cpu_count() or 1


def usable_cores() -> tuple[int, int]:
    """(physical, logical) cores this process may use: the machine's counts, capped by the affinity mask."""
    logical_total = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    physical_total = psutil.cpu_count(logical=False) or logical_total
    logical = min(logical_total, usable_logical_cores())
    # Hyper-threads pair up: a mask of `logical` CPUs spans at least logical * physical/logical_total cores.
    physical = max(1, min(physical_total, round(logical * physical_total / logical_total)))
    return physical, logical
