"""Kiln's `precisions: auto` search run on this host alone: the benchmarks' measure-and-decide loop.

`search_locally` drives the same round planner the pipeline drives (workers.quantize.search `plan_round`),
judges the families with the same verdicts (workers.quantize.verdicts) and decides with the same decision
(workers.scoring), but builds, measures and re-times every candidate in this process tree instead of on
device agents. benchmarks/quantization.py compares its pick with the vendors' default tools; it is not
part of the product (no server, worker or agent imports it).
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from devices.agent.capabilities import cpu_isa
from devices.agent.runner import evaluate_outputs
from devices.backends.registry import get_backend
from devices.bench import INTERLEAVED_WINDOW, BenchmarkSettings, measure, rotated_order, summarize_latencies
from devices.cpus import usable_cores
from kiln_contract import contract
from kiln_contract.batching import sample_rows
from kiln_contract.metrics import evaluate
from kiln_contract.paired import MIN_ROUNDS, out_of_time, stop_reason
from workers.datasets import LABELS, iter_batches
from workers.inspect import infer_output_kinds, inspect_onnx
from workers.quantize.families import COMPILE_SEPARATOR, VENDOR_DEFAULTS, is_vendor_default
from workers.quantize.isa_families import isa_notes
from workers.quantize.isolated import build_isolated, rank_nodes_isolated
from workers.quantize.round_budget import finalists_retime_seconds, fit_round
from workers.quantize.search import parse_tolerance, plan_round
from workers.quantize.verdicts import compile_winners, family_verdicts, ranking_pays
from workers.scoring import pareto_ids, recommend

logger = logging.getLogger(__name__)

# A vendor default is built even past the time budget, within this: without it there is no baseline.
VENDOR_BUILD_TIMEOUT_S = 600.0


def host_isa() -> list[str]:
    """ISA flags of this CPU as the agent reports them (x86 flags, Arm features or HWCAP; empty where unreadable)."""
    return cpu_isa()


def search_locally(
    *,
    model_path: str | Path,
    calibration_path: str | Path | None,
    validation_path: str | Path,
    tolerance: Any,
    backends: tuple[str, ...] | list[str] = ("onnxruntime", "openvino"),
    max_rounds: int = 5,
    time_budget_s: float = 600.0,
    work_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
    threads: int | None = 1,
    device_isa: list[str] | None = None,
    benchmark: dict[str, Any] | None = None,
    max_validation_samples: int = 512,
    sensitivity_samples: int = 64,
    confirm_windows: int = 5,
    metrics: list[dict[str, Any]] | None = None,
    build_workers: int | None = None,
    memory_budget_mb: int | None = None,
) -> dict[str, Any]:
    """Run the auto search on this host: build each round's candidates, measure them on each backend, recommend.

    `threads` pins the inference threads (the benchmark compares at one thread); None makes the
    thread count a search dimension (this host's physical and logical cores). Builds run in child
    processes under `memory_budget_mb` (default KILN_BUILD_MEMORY_MB), `build_workers` at a time
    (default: the CPU count). The search stops when `time_budget_s` is spent and reports the best so far; its rounds end
    early enough for the final re-timing of the finalists to fit the budget too (round_budget.retime_seconds).

    Returns `{"variants", "recommended", "reason", "pareto", "rounds", "sensitivity", "elapsed_s", "stopped",
    "notes", "failures", "builds"}` with variants shaped like the report's (`id`, `key`, `backend`,
    `precision`, `recipe`, `compile`, `latency_ms`, `accuracy`, `size_bytes`, `path`).
    """
    started = time.monotonic()
    deadline = started + time_budget_s
    tolerance = parse_tolerance(tolerance)
    settings = BenchmarkSettings.from_dict(benchmark or {"warmup_runs": 5, "warmup_seconds": 0.2,
                                                         "min_runs": 20, "min_seconds": 0.6})
    scratch = tempfile.TemporaryDirectory(prefix="kiln-search-") if work_dir is None else None
    work = Path(work_dir or scratch.name)
    work.mkdir(parents=True, exist_ok=True)
    cache = Path(cache_dir) if cache_dir else work / "cache"
    isa = device_isa if device_isa is not None else host_isa()
    validation = _Validation(model_path, validation_path, max_validation_samples, metrics or [])
    model_facts = {**inspect_onnx(model_path), **validation.shape_facts}
    thread_choices = None if threads else host_thread_choices()
    workers = max(1, build_workers or os.cpu_count() or 1)

    sensitivity: list[dict[str, Any]] | None = None
    entries: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    builds: list[dict[str, Any]] = []
    recipes: dict[str, tuple[Path, dict[str, Any]]] = {}
    rounds = 0
    budget_notes: list[str] = []
    stopped = "search complete: tolerance met with no faster candidate left"
    for round_number in range(1, max_rounds + 2):
        # The rounds end early enough for the final re-timing of the finalists known so far to fit the budget too.
        reserve = _retime_reserve(entries, confirm_windows)
        rounds_deadline = deadline - reserve
        if round_number > 1 and sensitivity is None and calibration_path is not None and ranking_pays(family_verdicts(entries, isa=isa)):
            # Sensitivity feeds only INT8's refinements: computed once INT8 has shown it can win.
            sensitivity = _rank_nodes_safely(model_path, calibration_path, sensitivity_samples, memory_budget_mb, failures)
        specs = plan_round(round_number=round_number, model_facts=model_facts, device_isa=isa, backends=list(backends),
                           has_calibration=calibration_path is not None, tolerance=tolerance,
                           sensitivity=sensitivity, measured=entries, thread_choices=thread_choices,
                           seconds_left=rounds_deadline - time.monotonic())
        specs = _not_failed(specs, failures)
        if not specs:
            break
        if round_number > max_rounds:
            stopped = f"stopped after max_rounds={max_rounds} with refinements left"
            break
        kept_back = f" (about {reserve:.0f} s of it kept for re-timing the finalists)" if reserve else ""
        if time.monotonic() >= rounds_deadline:
            stopped = (f"time budget of {time_budget_s:g} s ran out before round {round_number}{kept_back}; "
                       "reporting the best so far")
            break
        fitted = fit_round(specs, round_number=round_number, seconds_left=rounds_deadline - time.monotonic(),
                           elapsed_s=time.monotonic() - started, measurements=len(entries))
        budget_notes.extend([fitted.note] if fitted.note else [])
        if not fitted.kept:
            stopped = (f"time budget of {time_budget_s:g} s: what is left would not cover round {round_number}'s candidates"
                       f"{kept_back}; reporting the best so far")
            break
        specs = fitted.kept
        rounds = round_number
        fresh = _build_round([spec for spec in specs if _recipe_key(spec) not in recipes], model_path, calibration_path,
                             work, cache, workers, memory_budget_mb, rounds_deadline, failures)
        builds.extend({"key": key, "peak_rss_mb": result.get("peak_rss_mb"), "build_s": result.get("build_s"),
                       "cache": result.get("cache")} for key, (_, result) in fresh.items())
        recipes.update(fresh)
        built = {spec["key"]: recipes[_recipe_key(spec)] for spec in specs if _recipe_key(spec) in recipes}
        out_of_time = False
        for spec in specs:
            if spec["key"] not in built:
                continue
            out, result = built[spec["key"]]
            wanted = spec["backends"] or list(backends)
            for backend in [name for name in wanted if name in result["backends"] and name in backends]:
                # The vendor defaults are measured even late: the pick must be compared with what a user gets without Kiln.
                if time.monotonic() >= rounds_deadline and spec["key"] not in VENDOR_DEFAULTS:
                    out_of_time = True
                    break
                entries.append(_measure(out, backend, spec, result, validation, settings, threads, work, tolerance))
        if out_of_time or len(built) < len(specs) and time.monotonic() >= rounds_deadline:
            stopped = f"time budget of {time_budget_s:g} s ran out in round {round_number}{kept_back}; reporting the best so far"
            break

    # What pruned the search was decided on the first-pass timings: the notes say so before re-timing.
    notes = (isa_notes(isa) + [verdict["reason"] for verdict in family_verdicts(entries, isa=isa).values()] + compile_winners(entries)
             + budget_notes)
    _confirm_fastest(entries, validation, threads, work, confirm_windows, deadline=deadline)
    recommended, reason = recommend(entries, tolerance)
    pareto = pareto_ids(entries)
    for entry in entries:
        entry["pareto"] = entry["id"] in pareto
    if scratch is not None:
        # The caller gave no work_dir, so nobody can open the artifacts later; keep only the numbers.
        for entry in entries:
            entry.pop("path", None)
        scratch.cleanup()
    return {
        "variants": entries,
        "failures": failures,
        "recommended": recommended,
        "reason": reason,
        "notes": notes,
        "pareto": sorted(pareto),
        "rounds": rounds,
        "sensitivity": sensitivity,
        "tolerance": tolerance,
        "builds": builds,
        "peak_build_rss_mb": max((b["peak_rss_mb"] or 0.0 for b in builds), default=0.0),
        "elapsed_s": time.monotonic() - started,
        "stopped": stopped,
    }


def host_thread_choices() -> list[int]:
    """This host's physical and logical core counts (one entry when they are equal)."""
    return sorted(set(usable_cores()))


def _rank_nodes_safely(model_path, calibration_path, samples: int, budget: int | None, failures: list) -> list[dict[str, Any]]:
    """Sensitivity ranking in a child process under the memory budget; a failure leaves the search without refinements."""
    try:
        return rank_nodes_isolated(model_path=model_path, calibration_path=calibration_path, max_samples=samples,
                                   memory_budget=budget)
    except Exception as error:
        failures.append({"key": "sensitivity", "error": f"{type(error).__name__}: {error}"})
        return []


def _build_round(specs, model_path, calibration_path, work: Path, cache: Path, workers: int, budget: int | None,
                 deadline: float, failures: list) -> dict[str, tuple[Path, dict[str, Any]]]:
    """Build every distinct recipe of the round, `workers` at a time, each in its own process under the memory budget.

    Returns `{recipe key: (artifact path, build result)}`; specs that differ only in compile options share one build.
    """
    recipes: dict[str, dict[str, Any]] = {}
    for spec in sorted(specs, key=lambda spec: spec["key"] not in VENDOR_DEFAULTS):
        recipes.setdefault(_recipe_key(spec), spec)

    def build(spec):
        out = work / "variants" / f"{_recipe_key(spec)}.onnx"
        # A vendor default is built even past the budget (within VENDOR_BUILD_TIMEOUT_S): without it there is no baseline.
        floor = VENDOR_BUILD_TIMEOUT_S if spec["key"] in VENDOR_DEFAULTS else 30.0
        try:
            return out, build_isolated(model_path=model_path, precision=spec["precision"], out_path=out,
                                       calibration_path=calibration_path, options=spec["options"], cache_dir=cache,
                                       memory_budget=budget, timeout_s=max(floor, deadline - time.monotonic() + 30.0))
        except Exception as error:
            failures.append({"key": spec["key"], "error": f"{type(error).__name__}: {error}" if type(error).__name__ not in
                             ("NotApplicable", "QuantizationError") else str(error)})
            return None

    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = dict(zip(recipes, pool.map(build, recipes.values())))
    return {key: result for key, result in results.items() if result is not None}


def _not_failed(specs: list[dict[str, Any]], failures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The specs whose recipe has not failed to build: a failed build is tried once, as the pipeline keeps its failed
    variant and never proposes that key again (a QAT the interpreter cannot run would otherwise take every round)."""
    failed = {failure["key"] for failure in failures}
    return [spec for spec in specs if _recipe_key(spec) not in failed]


def _recipe_key(spec: dict[str, Any]) -> str:
    """The build's name: the spec's key without its compile options."""
    return spec["key"].split(COMPILE_SEPARATOR)[0]


class _Validation:
    """Validation inputs (bounded), labels, and the FP32 reference outputs on them."""

    def __init__(self, model_path: str | Path, validation_path: str | Path, limit: int, declared: list[dict[str, Any]]):
        session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
        self.input_names = [value.name for value in session.get_inputs()]
        self.output_names = [value.name for value in session.get_outputs()]
        first = session.get_inputs()[0].shape
        self.static_batch = first[0] if first and isinstance(first[0], int) and first[0] > 0 else None
        batch = self.static_batch or 16
        self.batches = list(iter_batches(validation_path, input_names=self.input_names, batch_size=batch, limit=limit))
        if self.static_batch:
            self.batches = [b for b in self.batches if len(next(iter(b.values()))) == self.static_batch]
        with np.load(validation_path, allow_pickle=False) as archive:
            self.labels = archive[LABELS][: sum(len(next(iter(b.values()))) for b in self.batches)] if LABELS in archive else None
        self.reference = self.run(lambda feeds: dict(zip(self.output_names, session.run(None, feeds))))
        declared = contract.parse_declared_metrics(declared, outputs=self.output_names)
        self.plan = contract.evaluation_plan(output_kinds=infer_output_kinds(model_path, self.reference), output_order=self.output_names,
                                             declared=declared, has_labels=self.labels is not None)
        # The inputs the reference came from, sample for sample: the metrics read attention masks from them.
        self.inputs = {name: np.concatenate([batch[name] for batch in self.batches]) for name in self.batches[0]}
        single = {name: np.ascontiguousarray(value[: self.static_batch or 1]) for name, value in self.batches[0].items()}
        self.benchmark_feeds = single
        dynamic = [value.name for value in session.get_inputs()
                   if any(not isinstance(dim, int) or dim <= 0 for dim in value.shape)]
        # The shapes of the user's data at the benchmark's batch: what static-shape compilation specialises to.
        self.shape_facts = {"dynamic_inputs": dynamic,
                            "data_shapes": {name: list(value.shape) for name, value in single.items()}}

    def run(self, infer) -> dict[str, np.ndarray]:
        """Every validation sample through `infer` at the batch the benchmark times (1, or the model's static batch), as a
        device evaluates a variant (devices.agent.runner `evaluate_outputs`): a runtime whose outputs change with the
        batch is judged at the batch it is timed at."""
        parts: dict[str, list[np.ndarray]] = {}
        for batch in self.batches:
            total = len(next(iter(batch.values())))
            step = self.static_batch or 1
            for start in range(0, total, step):
                feeds = {name: np.ascontiguousarray(value[start : start + step]) for name, value in batch.items()}
                rows = len(next(iter(feeds.values())))
                for name, value in infer(feeds).items():
                    parts.setdefault(name, []).append(sample_rows(value, batch_size=rows, rows=rows))
        return {name: np.concatenate(values) for name, values in parts.items()}


def _retime_reserve(entries: list[dict[str, Any]], windows: int) -> float:
    """Seconds of the budget set aside for `_confirm_fastest` on today's contenders (round_budget.retime_seconds)."""
    return finalists_retime_seconds(confirmation_contenders(entries), rounds=max(windows, MIN_ROUNDS)) if windows >= 1 else 0.0


def confirmation_contenders(entries: list[dict[str, Any]], max_contenders: int = 6) -> list[dict[str, Any]]:
    """Who is re-timed side by side at the end: the fastest passing variants and every passing vendor default.

    The vendor defaults (FP32 with runtime defaults on each backend, ORT's and NNCF's INT8
    defaults) always join, so the pick is judged against what a user gets without Kiln on paired,
    interleaved rounds rather than on first-pass timings from different rounds.
    """
    passing = sorted((e for e in entries if e.get("latency_ms") and e["accuracy"].get("within_tolerance") and e.get("path")),
                     key=lambda e: e["latency_ms"]["p50"])
    contenders = passing[:max_contenders]
    contenders += [entry for entry in passing[max_contenders:] if is_vendor_default(entry)]
    return contenders


def _confirm_fastest(entries: list[dict[str, Any]], validation: _Validation, threads: int | None, work: Path,
                     windows: int, max_windows: int = 15, deadline: float | None = None) -> None:
    """Re-time the contenders (`confirmation_contenders`) side by side, as a device's RETIME task does (kiln_contract/paired.py).

    Rounds are measured minutes apart, and on a busy machine the load drifts between them, so
    first-pass timings from different rounds do not compare. The contenders are timed again in
    rotated, interleaved rounds so every one sees the same drift, until `paired.stop_reason` says
    stop (at least `windows` and MIN_ROUNDS rounds, at most `max_windows`): the rule the agent
    stops by, so the leader separates at the confidence every decision uses (workers/noise.py); past the minimum, the
    rounds also stop at `deadline` (the end of the search's time budget: `paired.out_of_time`, the agent's rule while
    other jobs wait), so a re-timing that needs more windows than its reserve planned does not run past the budget. Each
    contender's row becomes that one measurement set: every figure of `latency_ms` summarizes the
    rounds' samples, its round medians go to `timing.interleaved_medians_ms` (paired across
    contenders) and the first pass stays apart as `latency_ms_first_pass`. The others' figures are
    all scaled by the drift the contenders saw (`drift_adjusted`), each row still one set.
    """
    contenders = confirmation_contenders(entries)
    if windows < 1 or len(contenders) < 2:
        return
    settings = BenchmarkSettings.from_dict(INTERLEAVED_WINDOW)
    compiled = [get_backend(e["backend"]).compile(e["path"], work / "confirm" / e["id"], threads=threads, options=e.get("compile"))
                for e in contenders]
    try:
        bound = [model.bind(validation.benchmark_feeds) for model in compiled]
        samples: list[list[np.ndarray]] = [[] for _ in contenders]
        started = time.monotonic()
        max_seconds = None if deadline is None else max(0.0, deadline - started)
        min_rounds = max(windows, MIN_ROUNDS)
        while True:
            for index in rotated_order(len(bound), len(samples[0])):
                samples[index].append(measure(bound[index], settings)["samples_ms"])
            medians = [[float(np.median(part)) for part in parts] for parts in samples]
            if (stop_reason(medians, min_rounds=min_rounds, max_rounds=max(windows, max_windows))
                    or out_of_time(time.monotonic() - started, max_seconds, rounds=len(medians[0]), min_rounds=min_rounds)):
                break
        drifts = []
        for entry, parts, rounds in zip(contenders, samples, medians):
            entry["latency_ms_first_pass"] = entry["latency_ms"]
            entry["latency_ms"] = summarize_latencies(np.concatenate(parts))
            entry["timing"] = {**(entry.get("timing") or {}), "interleaved_medians_ms": rounds, "window_medians_ms": rounds,
                               "source": "side by side"}
            entry["confirmed"] = len(rounds)
            drifts.append(entry["latency_ms"]["p50"] / entry["latency_ms_first_pass"]["p50"])
    finally:
        for model in compiled:
            model.close()
    drift = float(np.median(drifts))
    for entry in entries:
        if entry.get("latency_ms") and not entry.get("confirmed"):
            entry["latency_ms_first_pass"] = entry["latency_ms"]
            entry["latency_ms"] = _scaled(entry["latency_ms"], drift)
            entry["drift_adjusted"] = drift


# The figures of a latency summary that are times (scaled by a drift); cv and count are not.
_TIMES = ("p50", "p90", "p99", "mean", "std", "min", "max")


def _scaled(latency: dict[str, Any], factor: float) -> dict[str, Any]:
    return {**latency, **{name: latency[name] * factor for name in _TIMES if latency.get(name) is not None}}


def _measure(path: Path, backend_name: str, spec: dict[str, Any], built: dict[str, Any], validation: _Validation,
             settings, threads: int | None, work: Path, tolerance: dict[str, Any]) -> dict[str, Any]:
    compile_options = dict(spec.get("compile") or {})
    entry: dict[str, Any] = {
        "id": f"{spec['key']}@{backend_name}", "key": spec["key"], "backend": backend_name,
        "precision": spec["precision"], "options": spec["options"], "compile": compile_options,
        "recipe": {**built["recipe"], **({"compile": compile_options} if compile_options else {})},
        "size_bytes": built["size_bytes"], "cache": built.get("cache"), "path": str(path),
        "build_peak_rss_mb": built.get("peak_rss_mb"), "latency_ms": None, "accuracy": {"value": None}, "error": None,
    }
    try:
        started = time.perf_counter()
        compiled = get_backend(backend_name).compile(path, work / "compiled" / entry["id"], threads=threads, options=compile_options)
        # As a device reports it: what the final re-timing's reserve counts to compile it again (round_budget).
        entry["load_ms"] = (time.perf_counter() - started) * 1000.0
        try:
            # As a device evaluates it: batch 1 (or the build's static batch), the batch the latency is timed at.
            outputs = evaluate_outputs(compiled, validation.inputs)
            reference = {name: validation.reference[name] for name in validation.output_names}
            measured = evaluate({name: outputs[name] for name in reference}, reference, validation.plan, validation.labels,
                                inputs=validation.inputs)
            entry["accuracy"] = contract.score_accuracy(tolerance, measured)
            result = measure(compiled.bind(validation.benchmark_feeds), settings)
            entry["latency_ms"] = result["latency_ms"]
            entry["unstable"] = result["unstable"]
        finally:
            compiled.close()
    except Exception as error:
        logger.warning("measuring %s failed: %s", entry["id"], error)
        entry["error"] = f"{type(error).__name__}: {error}"
    return entry
