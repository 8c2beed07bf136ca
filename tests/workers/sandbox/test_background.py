"""Work nobody waits on runs in the background: an upload's operator-support check takes only the CPU others leave idle.

Issue 33's team load: a hostile upload whose check computes until its limit added 45% to three other users' wall time on
a 2-core machine, because its sandbox had a core's fair share. A background sandbox lowers its own nice value and its
session's autogroup (the kernel's autogroup scheduling shares a core between sessions first, so a process's nice value
alone changes nothing against another session).
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from devices import quiet
from workers.sandbox.child import BACKGROUND_NICE
from workers.sandbox.runner import SandboxFailed, run_confined
from workers.support import SupportCheckFailed, check_isolated

pytestmark = pytest.mark.timeout(180)
AUTOGROUPS = Path("/proc/sys/kernel/sched_autogroup_enabled").exists() and Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"


def _priority(**kwargs) -> dict:
    return run_confined("probe", {"targets": {"server_pid": os.getpid()}}, memory_mb=1024, **kwargs)["sandbox"]["priority"]


def test_a_background_sandbox_runs_at_the_lowest_priority_and_a_foreground_one_does_not():
    background, foreground = _priority(background=True), _priority()
    assert background["nice"] == BACKGROUND_NICE
    assert foreground["nice"] == os.getpriority(os.PRIO_PROCESS, 0)
    if AUTOGROUPS:
        assert background["autogroup_nice"] == BACKGROUND_NICE
        assert foreground["autogroup_nice"] != BACKGROUND_NICE


def _folding_model(path: Path, matmuls: int) -> Path:
    """Every operator constant: a runtime that folds constants at load (OpenVINO's reader) multiplies 1024x1024 matrices `matmuls` times
    before it can say which operators it runs (the team load's hostile upload, smaller)."""
    weight = numpy_helper.from_array((np.random.default_rng(0).standard_normal((1024, 1024)) / 32.0).astype(np.float32), "w")
    nodes, previous = [], "w"
    for index in range(matmuls):
        nodes.append(helper.make_node("MatMul", [previous, "w"], [f"m{index}"]))
        previous = f"m{index}"
    nodes += [helper.make_node("ReduceMean", [previous], ["r"], keepdims=0), helper.make_node("Add", ["x", "r"], ["y"])]
    graph = helper.make_graph(nodes, "folding", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _share_beside_a_check(model: Path, core: int, *, background: bool) -> float:
    """The CPU share a busy loop on `core` gets while an operator-support check of `model` computes on the same core."""
    def check():
        os.sched_setaffinity(0, {core})  # this thread, and so the sandbox it starts
        with contextlib.suppress(SandboxFailed, SupportCheckFailed):  # stopped at its time limit, as meant
            check_isolated(model, ["openvino"], timeout_s=6, background=background)

    os.sched_setaffinity(0, {core})
    checker = threading.Thread(target=check)
    checker.start()
    time.sleep(3.0)  # the child starts, imports OpenVINO and begins folding
    started_cpu, started = time.thread_time(), time.monotonic()
    while time.monotonic() - started < 2.0:
        pass
    share = (time.thread_time() - started_cpu) / (time.monotonic() - started)
    checker.join()
    return share


@pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="needs OpenVINO, whose reader folds the constants")
def test_a_background_check_leaves_a_busy_core_to_the_work_already_there(tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    model = _folding_model(tmp_path / "folding.onnx", matmuls=400)
    try:
        foreground = _share_beside_a_check(model, cores[-1], background=False)
        background = _share_beside_a_check(model, cores[-1], background=True)
    finally:
        os.sched_setaffinity(0, set(cores))
    # Sharing the core, the loop gets about half of it; beside a background check, nearly all of it.
    assert background > foreground + 0.25, (foreground, background)
    assert background > 0.8, (foreground, background)


def _during_a_check(model: Path, *, background: bool, probe) -> object:
    """What `probe()` answers while an operator-support check of `model` computes."""
    checker = threading.Thread(target=_check_quietly, args=(model, background))
    checker.start()
    try:
        time.sleep(3.0)  # the child starts, imports OpenVINO and begins folding
        return probe()
    finally:
        checker.join()


def _check_quietly(model: Path, background: bool) -> None:
    with contextlib.suppress(SandboxFailed, SupportCheckFailed):  # stopped at its time limit, as meant
        check_isolated(model, ["openvino"], timeout_s=6, background=background)


@pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="needs OpenVINO, whose reader folds the constants")
def test_a_background_check_pauses_for_a_timing_window_but_the_device_leaves_it_no_turn(tmp_path, monkeypatch):
    # Team load: a hostile upload's check is minutes long; counted as a waiting build, it made the agent idle before
    # every window for the builds' turn, and the other users' jobs took 27% longer.
    monkeypatch.setenv(quiet.QUIET_DIR_ENV, str(tmp_path / "quiet"))
    model = _folding_model(tmp_path / "folding.onnx", matmuls=400)

    def window() -> tuple[bool, bool]:
        waiting = quiet.builds_waiting()
        with quiet.QuietWindow(wait_for_builds_s=10) as timed:
            time.sleep(0.3)
        return waiting, timed.builds_paused

    assert _during_a_check(model, background=True, probe=window) == (False, True)
    assert _during_a_check(model, background=False, probe=window) == (True, True)
