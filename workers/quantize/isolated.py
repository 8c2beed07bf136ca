"""One variant build in its own process, under a memory budget: a clear error instead of the OOM killer.

Calibration, sensitivity analysis and NNCF keep their working set in the process that runs them.
A child process per build lets a watchdog in the parent read the child's resident memory (with its
own children) several times a second and stop it, naming the budget, before the kernel has to
pick a victim, which on a worker host would be the Celery worker itself. The child reports its
peak RSS (`ru_maxrss`), so every build says what it cost. Only JSON crosses the boundary.

Run as `python -m workers.quantize.isolated REQUEST.json RESULT.json` by `build_isolated` and
`rank_nodes_isolated` (the sensitivity analysis, which runs the model over calibration batches too).

While an agent on the same host times a measurement, the child is paused (devices/quiet.py
`BuildPauser`): a build never competes with a device for its cores, and the time paused does not
count against the build's time limit.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from devices.quiet import BuildPauser

DEFAULT_MEMORY_BUDGET_MB = 4096
MEMORY_BUDGET_ENV = "KILN_BUILD_MEMORY_MB"
POLL_SECONDS = 0.1
_ERRORS = ("NotApplicable", "QuantizationError", "ValueError")


class BuildMemoryExceeded(RuntimeError):
    """A build outgrew the memory budget and was stopped; the message names the budget."""


def memory_budget_mb() -> int:
    """The per-build RSS budget in MB: KILN_BUILD_MEMORY_MB, default 4096; a bad value raises at once."""
    raw = os.environ.get(MEMORY_BUDGET_ENV, "")
    if not raw:
        return DEFAULT_MEMORY_BUDGET_MB
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{MEMORY_BUDGET_ENV} must be a whole number of megabytes, got {raw!r}") from None
    if value < 256:
        raise ValueError(f"{MEMORY_BUDGET_ENV} must be at least 256 (MB), got {value}")
    return value


def build_isolated(
    *,
    model_path: str | Path,
    precision: str,
    out_path: str | Path,
    calibration_path: str | Path | None = None,
    options: dict[str, Any] | None = None,
    cache_dir: str | Path | None = None,
    memory_budget: int | None = None,
    timeout_s: float = 3600.0,
) -> dict[str, Any]:
    """`build_variant` (or `cached_build_variant` with `cache_dir`) in a child process; adds `peak_rss_mb` and `build_s`.

    Raises the child's NotApplicable / QuantizationError as the same types, BuildMemoryExceeded when
    the child's RSS passes `memory_budget` MB (default: `memory_budget_mb()`), TimeoutError after `timeout_s`.
    """
    from workers.quantize.variants import NotApplicable, QuantizationError

    request = {"kind": "build", "model_path": str(model_path), "precision": precision, "out_path": str(out_path),
               "calibration_path": str(calibration_path) if calibration_path is not None else None,
               "options": options or {}, "cache_dir": str(cache_dir) if cache_dir is not None else None}
    started = time.monotonic()
    try:
        result = _run_child(request, f"the {precision} build ({describe_recipe(options or {})})", memory_budget, timeout_s)
    except BuildMemoryExceeded:
        Path(out_path).unlink(missing_ok=True)
        raise
    if "error" in result:
        kind, message = result["error"]["type"], result["error"]["message"]
        raise {"NotApplicable": NotApplicable, "QuantizationError": QuantizationError, "ValueError": ValueError}.get(kind, RuntimeError)(message)
    built = result["built"]
    built["peak_rss_mb"] = result["peak_rss_mb"]
    built["build_s"] = time.monotonic() - started
    built["paused_s"] = result.get("paused_s", 0.0)
    return built


def rank_nodes_isolated(*, model_path: str | Path, calibration_path: str | Path, max_samples: int = 64,
                        memory_budget: int | None = None, timeout_s: float = 3600.0) -> list[dict[str, Any]]:
    """`sensitivity.rank_nodes` in a child process under the same memory budget as a build."""
    request = {"kind": "rank_nodes", "model_path": str(model_path), "calibration_path": str(calibration_path),
               "max_samples": int(max_samples)}
    result = _run_child(request, "the sensitivity analysis", memory_budget, timeout_s)
    if "error" in result:
        raise RuntimeError(result["error"]["message"])
    return result["ranking"]


def _run_child(request: dict[str, Any], what: str, memory_budget: int | None, timeout_s: float) -> dict[str, Any]:
    """Run one request in a child process under the watchdog; the child's JSON result with `peak_rss_mb`."""
    budget = memory_budget or memory_budget_mb()
    with tempfile.TemporaryDirectory(prefix="kiln-build-") as scratch:
        request_path, result_path = Path(scratch) / "request.json", Path(scratch) / "result.json"
        request_path.write_text(json.dumps(request))
        stderr_path = Path(scratch) / "stderr.txt"
        # The child runs in the scratch directory: onnxruntime.quantization writes scratch models into the cwd.
        with open(stderr_path, "wb") as stderr_file:
            process = subprocess.Popen([sys.executable, "-m", "workers.quantize.isolated", str(request_path), str(result_path)],
                                       cwd=scratch, env=_child_env(budget), stdout=subprocess.DEVNULL, stderr=stderr_file)
        watch = _Watchdog(process.pid, budget)
        pauser = BuildPauser(process.pid)
        watch.start()
        pauser.start()
        try:
            _wait_running(process, timeout_s, pauser, what)
        finally:
            pauser.stop()
            watch.stop()
        stderr = stderr_path.read_bytes()
        paused_s = pauser.paused_seconds()
        if watch.exceeded:
            # Calibration streams within the budget and says itself what it needs (workers.quantize.streaming); what
            # the watchdog stops is another part of the build (pre-processing, the quantizer, a tool), still growing.
            raise BuildMemoryExceeded(
                f"{what} used more than the build memory budget of {budget} MB ({MEMORY_BUDGET_ENV}) and was stopped: "
                f"it held {watch.peak_mb:.0f} MB, still growing, after {watch.elapsed_s:.0f} s. What would fit: a budget "
                f"of more than {_round_up(watch.peak_mb * 1.5)} MB to be safe, or a precision that needs no calibration "
                "(int8-dynamic, int4-weight)")
        if not result_path.is_file():
            tail = stderr.decode(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"{what} process died (exit {process.returncode}): {' | '.join(tail)}")
        result = json.loads(result_path.read_text())
    # The watchdog's samples, not the child's ru_maxrss: Linux carries ru_maxrss across execve, so
    # a child of a large parent would report the parent's peak. ru_maxrss only fills in for a child
    # too short-lived to be sampled.
    result["peak_rss_mb"] = watch.peak_mb or result.get("peak_rss_mb") or 0.0
    # How long the build stood paused while an agent of this host timed (devices/quiet.py).
    result["paused_s"] = round(paused_s, 3)
    return result


def describe_recipe(options: dict[str, Any]) -> str:
    """A build's options in a few words, for its errors ("tool onnxruntime, calibration_method minmax, per_channel False")."""
    named = ("runtime", "tool", "calibration_method", "calibrator", "per_channel", "activation_type", "quant_format",
             "model_type", "learn", "smooth_quant")
    words = [f"{key} {options[key]}" for key in named if key in options]
    return ", ".join(words) or "default options"


def _round_up(mb: float, step: int = 256) -> int:
    return int(-(-mb // step) * step)


def _wait_running(process: subprocess.Popen, timeout_s: float, pauser: BuildPauser, what: str) -> None:
    """Wait for the child; kill it once it has *run* (paused time left out) for longer than `timeout_s`."""
    started = time.monotonic()
    while True:
        try:
            process.wait(timeout=POLL_SECONDS)
            return
        except subprocess.TimeoutExpired:
            if time.monotonic() - started - pauser.paused_seconds() > timeout_s:
                pauser.stop()
                process.kill()
                process.wait()
                raise TimeoutError(f"{what} took longer than {timeout_s:.0f} s and was stopped") from None


def _child_env(budget_mb: int | None = None) -> dict[str, str]:
    env = dict(os.environ)
    if budget_mb is not None:
        # The child plans its own working set (calibration batches, workers.quantize.streaming) against the same budget.
        env[MEMORY_BUDGET_ENV] = str(budget_mb)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    return env


class _Watchdog(threading.Thread):
    """Polls a process tree's resident memory; kills the tree once it passes the budget."""

    def __init__(self, pid: int, budget_mb: int):
        super().__init__(daemon=True)
        self.pid, self.budget_mb = pid, budget_mb
        self.peak_mb = 0.0
        self.exceeded = False
        self.elapsed_s = 0.0
        self._watch_started = time.monotonic()
        self._done = threading.Event()

    def run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._done.wait(POLL_SECONDS):
            try:
                tree = [root, *root.children(recursive=True)]
                rss_mb = sum(_rss(process) for process in tree) / (1024 * 1024)
            except psutil.NoSuchProcess:
                return
            self.peak_mb = max(self.peak_mb, rss_mb)
            if rss_mb > self.budget_mb:
                self.exceeded = True
                self.elapsed_s = time.monotonic() - self._watch_started
                for process in reversed(tree):
                    with contextlib.suppress(psutil.NoSuchProcess):
                        process.kill()
                return

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=2)


def _rss(process) -> int:
    import psutil

    try:
        return process.memory_info().rss
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return 0


def _serve(request: dict[str, Any]) -> dict[str, Any]:
    if request.get("kind", "build") == "rank_nodes":
        from workers.quantize.sensitivity import rank_nodes

        return {"ranking": rank_nodes(model_path=request["model_path"], calibration_path=request["calibration_path"],
                                      max_samples=request["max_samples"])}
    arguments = {key: request[key] for key in ("model_path", "precision", "out_path", "calibration_path", "options")}
    if request.get("cache_dir"):
        from workers.quantize.cache import cached_build_variant

        return {"built": cached_build_variant(cache_dir=request["cache_dir"], **arguments)}
    from workers.quantize.variants import build_variant

    return {"built": build_variant(**arguments)}


def _child(request_path: str, result_path: str) -> None:
    import resource

    request = json.loads(Path(request_path).read_text())
    try:
        result: dict[str, Any] = _serve(request)
    except Exception as error:
        kind = type(error).__name__
        result = {"error": {"type": kind if kind in _ERRORS else "RuntimeError", "message": f"{error}" if kind in _ERRORS
                            else f"{kind}: {error}"}}
    # ru_maxrss is in kilobytes on Linux.
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    Path(result_path).write_text(json.dumps(result, default=str))


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
