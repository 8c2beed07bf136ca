"""A sandbox past its limit dies at once, whole, even busy in native code, and the caller is told which limit it passed.

The busy child is real: an ONNX Loop of a billion MatMuls run by ONNX Runtime (C++, never back in Python) through the
sandbox's `reference.compute` command, the FP32 reference run of a job.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest
from onnx import TensorProto, helper, numpy_helper, save

from workers.sandbox.runner import SandboxLimitExceeded, probe, run_confined

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def busy(tmp_path_factory):
    """A model that keeps ONNX Runtime busy in native code for hours, and one input for it."""
    folder = tmp_path_factory.mktemp("busy")
    folder.chmod(0o755)
    body = helper.make_graph(
        [helper.make_node("MatMul", ["y_in", "w"], ["y_out"]), helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y_in", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("y_out", TensorProto.FLOAT, ["n", 64])],
        [numpy_helper.from_array(np.eye(64, dtype=np.float32) * 0.5, "w")])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "keep_going", "x"], ["y"], body=body)], "busy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])],
        [numpy_helper.from_array(np.array(10**12, np.int64), "trips"), numpy_helper.from_array(np.array(True), "keep_going")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    save(model, str(folder / "busy.onnx"))
    np.savez(folder / "inputs.npz", x=np.ones((1, 64), np.float32))
    for path in folder.iterdir():
        path.chmod(0o644)
    return folder / "busy.onnx", folder / "inputs.npz"


def _request(busy) -> dict:
    model, inputs = busy
    return {"model": str(model), "inputs": str(inputs), "feeds": None}


@pytest.fixture(scope="module")
def namespaces():
    sandbox = probe()["sandbox"]
    if not sandbox["pid_namespace"]:
        pytest.skip(f"this kernel grants the sandbox no PID namespace: {sandbox['notes']}")


@pytest.mark.parametrize(("limits", "limit", "words"), [
    ({"cpu_seconds": 2, "wall_seconds": 60}, "cpu", "more than 2 s of CPU time (the sandbox's CPU limit)"),
    ({"cpu_seconds": None, "wall_seconds": 2}, "wall", "took longer than 2 s (the sandbox's time limit)"),
])
def test_a_child_busy_in_native_code_past_its_limit_is_killed_and_the_error_names_the_limit(busy, limits, limit, words, tmp_path,
                                                                                          monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this test's sandboxes, told apart from any other on the host
    started = time.monotonic()
    with pytest.raises(SandboxLimitExceeded) as exceeded:
        run_confined("reference.compute", _request(busy), shared=busy, what="the FP32 reference run", **limits)
    assert exceeded.value.limit == limit and exceeded.value.value == 2 and words in str(exceeded.value)
    assert str(exceeded.value).startswith("the FP32 reference run ")
    assert time.monotonic() - started < 30
    leftover = [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert not [p for p in leftover if p.status() != psutil.STATUS_ZOMBIE], leftover


def _sandbox_processes(worker: psutil.Process, timeout_s: float = 30) -> list[psutil.Process]:
    """The worker's sandbox: its child and the process that child forked into its own PID namespace, once both run."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        tree = [p for p in worker.children(recursive=True) if "workers.sandbox.child" in " ".join(p.cmdline())]
        if len(tree) >= 2 and all(p.cpu_times().user > 0.5 for p in tree[1:]):
            return tree
        time.sleep(0.2)
    raise AssertionError("the sandbox never got busy")


def _all_gone(processes: list[psutil.Process], timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in processes):
            return True
        time.sleep(0.1)
    return False


def _worker(busy) -> subprocess.Popen:
    """A process that runs the busy reference in the sandbox, as a Celery worker would."""
    code = textwrap.dedent(f"""
        from workers.sandbox.runner import run_confined
        run_confined("reference.compute", {_request(busy)!r}, shared=({str(busy[0])!r}, {str(busy[1])!r}), cpu_seconds=None, wall_seconds=600)
    """)
    return subprocess.Popen([sys.executable, "-c", code], env=os.environ.copy())


def test_a_worker_killed_outright_takes_its_sandbox_with_it(busy, namespaces):
    """Celery's hard time limit SIGKILLs the worker: its sandbox (its own session, a PID namespace) must not run on."""
    worker = _worker(busy)
    try:
        sandbox = _sandbox_processes(psutil.Process(worker.pid))
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        assert _all_gone(sandbox), [p.status() for p in sandbox if p.is_running()]
    finally:
        worker.kill()
        worker.wait()


def test_sigterm_ends_a_sandbox_busy_in_native_code(busy, namespaces):
    """The forked child is its PID namespace's init, which ignores a SIGTERM it has no handler for: it gets SIGKILL instead."""
    worker = _worker(busy)
    try:
        sandbox = _sandbox_processes(psutil.Process(worker.pid))
        sandbox[0].send_signal(signal.SIGTERM)
        assert _all_gone(sandbox), [p.status() for p in sandbox if p.is_running()]
    finally:
        worker.kill()
        worker.wait()


def test_a_child_between_its_vfork_and_its_exec_is_counted_once():
    """Every subprocess Python starts is a vfork: until its exec the child's resident set is its parent's. The watch once
    added it twice, and a build holding 500 MB of a 640 MB budget that looked up a library (ctypes.util.find_library runs
    ldconfig, gcc and ld, each refused in the sandbox) was stopped for memory it never used (CI, 2026-12-07).

    The moment is caught and held: a child seen alive is stopped (SIGSTOP); one stopped before its exec keeps its
    parent's memory, and its parent waits (vfork), until it goes on."""
    from workers.sandbox.runner import _tree_usage

    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import subprocess, sys, time
        import numpy as np
        held = np.ones(300 << 17)  # 300 MB, every page touched
        print("ready", flush=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                subprocess.run(["/nonexistent/kiln-helper"])
            except OSError:
                pass
    """)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"ready"
        parent = psutil.Process(holder.pid)
        caught = _catch_a_vforked_child(parent, seconds=90)
        assert caught is not None, "no child of the holder was caught between its vfork and its exec in 90 s"
        try:
            counted, _ = _tree_usage(holder.pid)
            own = parent.memory_info().rss / (1 << 20)
            assert own > 250 and counted == pytest.approx(own, rel=0.01), (counted, own)
        finally:
            caught.resume()
    finally:
        holder.kill()
        holder.wait()


def _catch_a_vforked_child(parent: psutil.Process, *, seconds: float) -> psutil.Process | None:
    """A child of `parent` stopped while it still shares its parent's memory (same resident and virtual size), or None."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for child in parent.children():
            try:
                child.suspend()
                stopped_by = time.monotonic() + 0.5
                while child.status() not in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE) and time.monotonic() < stopped_by:
                    time.sleep(0.001)
                if child.status() == psutil.STATUS_STOPPED and child.memory_info()[:2] == parent.memory_info()[:2]:
                    return child
                child.resume()
            except psutil.Error:
                pass
    return None
