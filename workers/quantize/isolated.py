"""One variant build in the OS sandbox, under a memory budget: a clear error instead of the OOM killer.

Calibration, sensitivity analysis and NNCF parse the user's model and calibration data with native code
(ONNX, ONNX Runtime's quantizer and sessions, NNCF, OpenVINO's reader, the LiteRT converter), so every build
runs as a sandboxed child (workers/sandbox: an unprivileged user, no network, a private file tree) that
sees the model and the calibration data read-only and writes only its own folder. The parent watches the
child's tree: past the resident-memory budget it is killed (SIGKILL) and BuildMemoryExceeded names the
budget, before the kernel has to pick a victim, which on a worker host would be the Celery worker itself.
Every build says what it cost (`peak_rss_mb`, the watch's samples). Only JSON and the artifact cross the
boundary.

While an agent on the same host times a measurement, the child is paused (devices/quiet.py
`BuildPauser`): a build never competes with a device for its cores, and the time paused does not
count against the build's time limit.

A build cache (`cache_dir`, the local search) is read and written by the parent only: a confined build can
never write an entry another model's build would read.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devices.quiet import BuildPauser
from workers.host_memory import BUILD_MEMORY_ENV, build_memory_mb
from workers.quantize.errors import NotApplicable, QuantizationError
from workers.sandbox.runner import SandboxLimitExceeded, model_shown, run_confined

_ERRORS = ("NotApplicable", "QuantizationError", "ValueError")


class BuildMemoryExceeded(SandboxLimitExceeded):
    """A build outgrew the memory budget and was stopped; the message names the budget (`limit` is "memory")."""

    def __init__(self, what: str, budget: int):
        super().__init__("memory", budget, what=what)
        # Calibration streams within the budget and says itself what it needs (workers.quantize.streaming); what the
        # watch stops is another part of the build (pre-processing, the quantizer, a tool), still growing.
        self.args = (f"{what} used more than the build memory budget of {budget} MB ({BUILD_MEMORY_ENV}) and was stopped. "
                     f"What would fit: a budget of more than {_round_up(budget * 1.5)} MB to be safe, or a precision that needs "
                     "no calibration (int8-dynamic, int4-weight)",)

    def __str__(self) -> str:
        return self.args[0]


class BuildTimeExceeded(SandboxLimitExceeded, TimeoutError):
    """A build ran (paused time left out) past its time limit and was stopped (`limit` is "wall")."""

    def __init__(self, what: str, timeout_s: float):
        super().__init__("wall", timeout_s, what=what)
        self.args = (f"{what} took longer than {timeout_s:.0f} s and was stopped",)

    def __str__(self) -> str:
        return self.args[0]


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
    model_folder: Path | None = None,
    watch: BuildWatch | None = None,
) -> dict[str, Any]:
    """`build_variant` in the sandbox (served from `cache_dir` when given and stored there); adds `peak_rss_mb`, `build_s`
    and `paused_s` (and `cache`, `cache_key` with a cache).

    `model_folder` is the model's own folder when it has one (an extracted zip with its external data). Raises the
    child's NotApplicable / QuantizationError / ValueError as the same types, BuildMemoryExceeded when the child's RSS
    passes `memory_budget` MB (default: `build_memory_mb()`), BuildTimeExceeded (a TimeoutError) after `timeout_s`.
    """
    started = time.monotonic()
    out_path = Path(out_path)
    entry = key = None
    if cache_dir is not None:
        from workers.quantize.cache import cache_entry, cache_take

        key, entry = cache_entry(cache_dir=cache_dir, model_path=model_path, precision=precision, options=options,
                                 calibration_path=calibration_path)
        stored = cache_take(entry, out_path)
        if stored is not None:
            return {**stored, "cache": "hit", "cache_key": key, "peak_rss_mb": 0.0, "build_s": time.monotonic() - started, "paused_s": 0.0}
    request = {"model_path": str(model_path), "model_folder": str(model_folder) if model_folder else None,
               "precision": precision, "out_name": out_path.name,
               "calibration_path": str(calibration_path) if calibration_path is not None else None, "options": options or {}}
    result = _run_child("quantize.build", request, f"the {precision} build ({describe_recipe(options or {})})", memory_budget, timeout_s,
                        shared=_shown(model_path, model_folder, calibration_path), outputs={f"out/{out_path.name}": out_path}, watch=watch)
    if "build_error" in result:
        kind, message = result["build_error"]["type"], result["build_error"]["message"]
        raise {"NotApplicable": NotApplicable, "QuantizationError": QuantizationError, "ValueError": ValueError}.get(kind, RuntimeError)(message)
    built = result["built"]
    built["peak_rss_mb"] = result["peak_rss_mb"]
    built["build_s"] = time.monotonic() - started
    built["paused_s"] = result.get("paused_s", 0.0)
    built["memory_wait_s"] = result.get("memory_wait_s", 0.0)
    built["sandbox"] = result.get("sandbox")  # which confinements held the build (workers/sandbox/confine.py)
    if entry is not None:
        from workers.quantize.cache import cache_put

        cache_put(entry, out_path, {name: value for name, value in built.items()
                                    if name not in ("peak_rss_mb", "build_s", "paused_s", "memory_wait_s")})
        built.update(cache="miss", cache_key=key)
    return built


def rank_nodes_isolated(*, model_path: str | Path, calibration_path: str | Path, max_samples: int = 64,
                        memory_budget: int | None = None, timeout_s: float = 3600.0, model_folder: Path | None = None,
                        watch: BuildWatch | None = None) -> list[dict[str, Any]]:
    """`sensitivity.rank_nodes` in the sandbox under the same memory budget as a build."""
    request = {"model_path": str(model_path), "model_folder": str(model_folder) if model_folder else None,
               "calibration_path": str(calibration_path), "max_samples": int(max_samples)}
    result = _run_child("quantize.rank", request, "the sensitivity analysis", memory_budget, timeout_s,
                        shared=_shown(model_path, model_folder, calibration_path), watch=watch)
    if "build_error" in result:
        raise RuntimeError(result["build_error"]["message"])
    return result["ranking"]


def _shown(model_path: str | Path, model_folder: Path | None, calibration_path: str | Path | None) -> tuple[Path, ...]:
    """What a build may read: the model (with its external data) and the calibration data, nothing else of the host."""
    return (*model_shown(model_path, model_folder), *((Path(calibration_path),) if calibration_path is not None else ()))


@dataclass
class BuildWatch:
    """Who to tell while a build waits: for host memory (`on_memory_wait(reason)`), paused for a device's timing window
    (`on_pause(what the device times)`), going on again (`on_continue()`); `what` names the build in the host's ledger."""

    what: str = "a build"
    on_memory_wait: Callable[[str], None] | None = None
    on_pause: Callable[[str], None] | None = None
    on_continue: Callable[[], None] | None = None


def _run_child(command: str, request: dict[str, Any], what: str, memory_budget: int | None, timeout_s: float, *,
               shared: tuple[Path, ...], outputs: dict[str, Path] | None = None, watch: BuildWatch | None = None) -> dict[str, Any]:
    """Run one request confined, once its memory budget fits on the host, its resident memory watched against the budget
    and paused while an agent times."""
    budget = memory_budget or build_memory_mb()
    # The child plans its own working set (calibration batches, workers.quantize.streaming) against the same budget.
    request = {**request, "memory_budget_mb": budget}
    watch = watch or BuildWatch(what=what)
    pause = functools.partial(BuildPauser, on_pause=watch.on_pause, on_continue=watch.on_continue)
    try:
        # No address-space limit: runtimes reserve far more than they touch; the watch counts what is resident.
        # No CPU-time limit either: a build uses every core it is given, and its time limit is the wall clock.
        result = run_confined(command, request, shared=shared, outputs=outputs, memory_mb=None, cpu_seconds=None,
                              wall_seconds=timeout_s, rss_mb=budget, pause=pause, threads=None, what=what, booked_as=watch.what,
                              on_memory_wait=watch.on_memory_wait)
    except SandboxLimitExceeded as exceeded:
        for destination in (outputs or {}).values():
            Path(destination).unlink(missing_ok=True)
        if exceeded.limit == "wall":
            raise BuildTimeExceeded(what, timeout_s) from None
        raise BuildMemoryExceeded(what, budget) from None
    usage = result.get("usage") or {}
    # The watch's samples, not the child's ru_maxrss: Linux carries ru_maxrss across execve, so a child of a large
    # parent would report the parent's peak. ru_maxrss only fills in for a child too short-lived to be sampled.
    result["peak_rss_mb"] = usage.get("peak_rss_mb") or result.get("peak_rss_mb") or 0.0
    # How long the build stood paused while an agent of this host timed (devices/quiet.py), and waited for memory.
    result["paused_s"] = round(usage.get("paused_s") or 0.0, 3)
    result["memory_wait_s"] = round(usage.get("memory_wait_s") or 0.0, 3)
    return result


def _staged_model(request: dict[str, Any], work: Path) -> str:
    """The model as seen from the child's own folder: links to its file(s), so that a tool that writes beside the model
    (ONNX Runtime's quantizer writes `<model>-inferred`) writes in the child's folder, not beside the user's upload."""
    model, folder = Path(request["model_path"]), request.get("model_folder")
    staged = work / "model"
    if folder:
        for path in Path(folder).rglob("*"):
            if path.is_file():
                link = staged / path.relative_to(folder)
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(path)
        return str(staged / model.relative_to(folder))
    staged.mkdir()
    for path in model_shown(model):
        (staged / path.name).symlink_to(path)
    return str(staged / model.name)


def describe_recipe(options: dict[str, Any]) -> str:
    """A build's options in a few words, for its errors ("tool onnxruntime, calibration_method minmax, per_channel False")."""
    named = ("runtime", "tool", "calibration_method", "calibrator", "per_channel", "activation_type", "quant_format",
             "model_type", "learn", "smooth_quant")
    words = [f"{key} {options[key]}" for key in named if key in options]
    return ", ".join(words) or "default options"


def _round_up(mb: float, step: int = 256) -> int:
    return int(-(-mb // step) * step)


def _serve(request: dict[str, Any], work: Path) -> dict[str, Any]:
    if request.get("memory_budget_mb"):
        os.environ[BUILD_MEMORY_ENV] = str(int(request["memory_budget_mb"]))
    request = {**request, "model_path": _staged_model(request, work)}
    if "max_samples" in request:
        from workers.quantize.sensitivity import rank_nodes

        return {"ranking": rank_nodes(model_path=request["model_path"], calibration_path=request["calibration_path"],
                                      max_samples=request["max_samples"])}
    from workers.quantize.variants import build_variant

    arguments = {key: request[key] for key in ("model_path", "precision", "calibration_path", "options")}
    return {"built": build_variant(out_path=work / "out" / Path(request["out_name"]).name, **arguments)}


def build_command(request: dict[str, Any], work: Path) -> dict[str, Any]:
    """The sandbox's `quantize.build` (and `quantize.rank`) command; a build's own errors come back by type."""
    import resource

    # onnxruntime.quantization writes scratch models into the current folder: the child's own.
    os.chdir(work)
    try:
        result: dict[str, Any] = _serve(request, work)
    except Exception as error:
        kind = type(error).__name__
        result = {"build_error": {"type": kind if kind in _ERRORS else "RuntimeError",
                                  "message": f"{error}" if kind in _ERRORS else f"{kind}: {error}"}}
    # ru_maxrss is in kilobytes on Linux.
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


rank_command = build_command


