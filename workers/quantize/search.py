"""`precisions: auto`: plan rounds of candidate variants, measure them, refine until the tolerance is met with nothing faster left.

`plan_round` is pure and deterministic: the pipeline calls it with what the devices measured, and
`search_locally` calls it with what this host measured (the benchmark uses that). Round 1 is a
broad sweep across backends, precisions, calibration methods and tools, including what the
vendors' own default tools produce, so the answer is never worse than theirs. Later rounds only
refine candidates that missed the tolerance yet are faster than the best variant that met it:
keeping more of the most sensitive nodes in float (INT8), or moving the most sensitive weights to
INT8 (INT4). Keeping nodes in float can only slow a variant down, so a family that is already
slower than the best passing variant is never refined, and a family whose last refinement passed
is finished.
"""

from __future__ import annotations

import logging
import math
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from devices import contract
from workers.learned.search import learned_proposals
from workers.quantize.schemes import (
    TRANSFORMER_INT8_OPS,
    has_fast_fp16,
    is_transformer,
    ort_int8_scheme,
)

logger = logging.getLogger(__name__)

KEEP_STEPS = (1, 2, 4, 8, 16, 32, 64)
_KEEP_SUFFIX = re.compile(r"^(?P<base>.+?)-keep(?P<k>\d+)$")
_MIX = re.compile(r"^int4-mix(?P<k>\d+)$")
_KEEP_FLOAT_OPS = {"int8": ("Conv", "ConvTranspose", "MatMul", "Gemm"), "int8-dynamic": ("MatMul", "Gemm")}


InvalidTolerance = contract.InvalidSpec
parse_tolerance = contract.parse_tolerance


# ---------------------------------------------------------------------------------------------
# Planning


def plan_round(
    *,
    round_number: int,
    model_facts: dict[str, Any],
    device_isa: list[str],
    backends: list[str],
    has_calibration: bool,
    tolerance: dict[str, Any],
    sensitivity: list[dict[str, Any]] | None,
    measured: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """Candidate specs `{"key", "precision", "options", "backends"}` for this round; [] when the search is done."""
    parse_tolerance(tolerance)
    sweep = _sweep(model_facts, list(device_isa), list(backends), has_calibration)
    if round_number <= 1:
        return sweep + _outlier_keep_specs(sweep, sensitivity or [])
    if not measured:
        return []
    templates = {spec["key"]: spec for spec in sweep}
    usable = [entry for entry in measured if _p50(entry) is not None and _accuracy(entry) is not None]
    passing = [_p50(entry) for entry in usable if _accuracy(entry).get("within_tolerance")]
    best_passing = min(passing) if passing else math.inf
    tried = {entry["key"] for entry in measured}

    # The deepest refinement measured so far for each family, with its fastest latency and verdict.
    families: dict[str, dict[str, Any]] = {}
    for entry in usable:
        family, depth = _family(entry["key"])
        if family is None:
            continue
        state = families.setdefault(family, {"depth": -1, "p50": math.inf, "passed": False})
        if depth > state["depth"]:
            state.update(depth=depth, p50=math.inf, passed=False)
        if depth == state["depth"]:
            state["p50"] = min(state["p50"], _p50(entry))
            state["passed"] = state["passed"] or bool(_accuracy(entry).get("within_tolerance"))

    ranking = sensitivity or []
    proposals: dict[str, dict[str, Any]] = {}
    for family in sorted(families):
        state = families[family]
        # Refining only adds float work, so a family at or above the best passing latency cannot win.
        if state["passed"] or state["p50"] >= best_passing:
            continue
        spec = _refine(family, state["depth"], templates, ranking)
        if spec is not None and spec["key"] not in tried:
            proposals[spec["key"]] = spec
    # Learned rounding (workers.learned) for a calibrated family that is fast but misses the tolerance.
    for spec in learned_proposals(sweep=sweep, measured=usable, best_passing=best_passing):
        if spec["key"] not in tried:
            proposals[spec["key"]] = spec
    return [proposals[key] for key in sorted(proposals)]


def _sweep(model_facts: dict[str, Any], isa: list[str], backends: list[str], has_calibration: bool) -> list[dict[str, Any]]:
    ops = dict(model_facts.get("op_histogram") or {})
    transformer = is_transformer(ops)
    scheme = ort_int8_scheme(isa)
    scheme_options = {"activation_type": scheme["activation_type"], "weight_type": scheme["weight_type"],
                      "reduce_range": scheme["reduce_range"]}
    specs = [_spec("fp32", "fp32", {})]
    if has_fast_fp16(isa):
        specs.append(_spec("fp16", "fp16", {}))
    if "MatMul" in ops or "Gemm" in ops:
        specs.append(_spec("int8-dynamic", "int8-dynamic", {}))
    if has_calibration:
        # What onnxruntime's quantize_static gives with its defaults (per-tensor MinMax QDQ), in the
        # device's integer scheme: the vendor baseline every other candidate must beat.
        specs.append(_spec("int8-minmax", "int8", {"calibration_method": "minmax", "per_channel": False, **scheme_options}))
        specs.append(_spec("int8-mse", "int8", {"calibration_method": "mse", "per_channel": True, **scheme_options}))
        specs.append(_spec("int8-entropy", "int8", {"calibration_method": "entropy", "calibrator": "kiln",
                                                    "per_channel": True, **scheme_options}))
        # NNCF with its defaults: the OpenVINO vendor baseline.
        specs.append(_spec("int8-nncf", "int8", {"tool": "nncf"}))
        if transformer:
            # NNCF's transformer type keeps LayerNorm/Softmax-adjacent patterns in float and adds SmoothQuant.
            specs.append(_spec("int8-nncf-transformer", "int8", {"tool": "nncf", "model_type": "transformer"}))
            specs.append(_spec("int8-mse-transformer", "int8", {
                "calibration_method": "mse", "per_channel": True, "op_types_to_quantize": list(TRANSFORMER_INT8_OPS),
                **scheme_options}))
    if "MatMul" in ops or "Gemm" in ops:
        int4_options: dict[str, Any] = {"block_size": 32, "symmetric": True}
        if "MatMul" not in ops:
            int4_options["gemm_to_matmul"] = True
        specs.append(_spec("int4-rtn", "int4-weight", int4_options))
    return specs


def _spec(key: str, precision: str, options: dict[str, Any], backends: list[str] | None = None) -> dict[str, Any]:
    return {"key": key, "precision": precision, "options": options, "backends": backends}


def _family(key: str) -> tuple[str | None, int]:
    """(family, depth): "int8-mse-keep4" → ("int8-mse", 4); "int4-mix2" → ("int4-rtn", 2); "int8-mse" → ("int8-mse", 0)."""
    if key in ("fp32", "fp16"):
        return None, 0
    mix = _MIX.match(key)
    if mix:
        return "int4-rtn", int(mix.group("k"))
    keep = _KEEP_SUFFIX.match(key)
    if keep:
        return keep.group("base"), int(keep.group("k"))
    return key, 0


def _refine(family: str, depth: int, templates: dict[str, dict[str, Any]], ranking: list[dict[str, Any]]) -> dict[str, Any] | None:
    template = templates.get(family)
    if template is None or not ranking:
        return None
    next_depth = next((step for step in KEEP_STEPS if step > depth), None)
    if template["precision"] == "int4-weight":
        order = sorted((row for row in ranking if row.get("int4_sqnr_db") is not None),
                       key=lambda row: row["int4_sqnr_db"])
        if next_depth is None or not order or depth >= len(order):
            return None
        chosen = [row["node"] for row in order[: min(next_depth, len(order))]]
        options = {**template["options"], "int8_nodes": chosen}
        return _spec(f"int4-mix{len(chosen)}", "int4-weight", options, template["backends"])
    ops = _KEEP_FLOAT_OPS.get(template["precision"])
    if ops is None:
        return None
    op_filter = set(template["options"].get("op_types_to_quantize") or ops)
    order = [row["node"] for row in ranking if row.get("op_type") in op_filter]
    if next_depth is None or not order or depth >= len(order):
        return None
    return _keep_spec(family, template, order[: min(next_depth, len(order))])


# A node this far below the median SQNR (and under the floor) collapses accuracy on its own.
OUTLIER_MARGIN_DB = 12.0
OUTLIER_FLOOR_DB = 25.0
EARLY_KEEP_FAMILY = "int8-mse"


def sensitivity_outliers(ranking: list[dict[str, Any]]) -> list[str]:
    """Nodes whose quantization error stands far out from the rest, most sensitive first."""
    scores = [row["sqnr_db"] for row in ranking if row.get("sqnr_db") is not None]
    if len(scores) < 2:
        return []
    median = float(np.median(scores))
    limit = min(OUTLIER_FLOOR_DB, median - OUTLIER_MARGIN_DB)
    return [row["node"] for row in ranking if row.get("sqnr_db") is not None and row["sqnr_db"] < limit]


def _outlier_keep_specs(sweep: list[dict[str, Any]], ranking: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Round 1 already keeps clear outliers in float: a sweep that is known to miss wastes a round."""
    templates = {spec["key"]: spec for spec in sweep}
    template = templates.get(EARLY_KEEP_FAMILY)
    outliers = sensitivity_outliers(ranking)
    if template is None or not outliers:
        return []
    ops = set(template["options"].get("op_types_to_quantize") or _KEEP_FLOAT_OPS[template["precision"]])
    op_of = {row["node"]: row.get("op_type") for row in ranking}
    chosen = [node for node in outliers if op_of.get(node) in ops]
    return [_keep_spec(EARLY_KEEP_FAMILY, template, chosen)] if chosen else []


def _keep_spec(family: str, template: dict[str, Any], chosen: list[str]) -> dict[str, Any]:
    # Only compute nodes are quantized, so an elementwise producer (a Mul, an Add) cannot hand
    # the kept node an already-quantized input.
    op_types = template["options"].get("op_types_to_quantize") or list(_KEEP_FLOAT_OPS[template["precision"]])
    options = {**template["options"], "nodes_to_exclude": chosen, "op_types_to_quantize": op_types}
    return _spec(f"{family}-keep{len(chosen)}", template["precision"], options, template["backends"])


def _p50(entry: dict[str, Any]) -> float | None:
    latency = entry.get("latency_ms") or {}
    return latency.get("p50")


def _accuracy(entry: dict[str, Any]) -> dict[str, Any] | None:
    accuracy = entry.get("accuracy")
    if not accuracy or accuracy.get("value") is None:
        return None
    return accuracy


# ---------------------------------------------------------------------------------------------
# The same rounds measured on this host


def host_isa() -> list[str]:
    """ISA flags of this CPU from /proc/cpuinfo (empty where unreadable)."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return sorted(set(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return []


def _scoring():
    try:
        from kiln.reports import scoring
    except ImportError:
        # kiln lives under platform/, which is not a package (it would shadow stdlib `platform`).
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "platform"))
        from kiln.reports import scoring
    return scoring


def search_locally(
    *,
    model_path: str | Path,
    calibration_path: str | Path | None,
    validation_path: str | Path,
    tolerance: Any,
    backends: tuple[str, ...] | list[str] = ("onnxruntime", "openvino"),
    max_rounds: int = 4,
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
) -> dict[str, Any]:
    """Run the auto search on this host: build each round's candidates, measure them on each backend, recommend.

    Returns `{"variants", "recommended", "reason", "pareto", "rounds", "sensitivity", "elapsed_s", "stopped"}`
    with variants shaped like the report's (`id`, `key`, `backend`, `precision`, `recipe`, `latency_ms`,
    `accuracy`, `size_bytes`, `path`).
    """
    import tempfile

    from devices.bench import BenchmarkSettings
    from workers.inspect import inspect_onnx
    from workers.quantize.cache import cached_build_variant
    from workers.quantize.sensitivity import rank_nodes
    from workers.quantize.variants import NotApplicable, QuantizationError

    started = time.monotonic()
    tolerance = parse_tolerance(tolerance)
    scoring = _scoring()
    settings = BenchmarkSettings.from_dict(benchmark or {"warmup_runs": 5, "warmup_seconds": 0.2,
                                                         "min_runs": 20, "min_seconds": 0.6})
    scratch = tempfile.TemporaryDirectory(prefix="kiln-search-") if work_dir is None else None
    work = Path(work_dir or scratch.name)
    work.mkdir(parents=True, exist_ok=True)
    cache = Path(cache_dir) if cache_dir else work / "cache"
    model_facts = inspect_onnx(model_path)
    isa = device_isa if device_isa is not None else host_isa()
    validation = _Validation(model_path, validation_path, max_validation_samples, metrics or [])

    sensitivity = None
    if calibration_path is not None:
        sensitivity = rank_nodes(model_path=model_path, calibration_path=calibration_path, max_samples=sensitivity_samples)

    entries: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    rounds = 0
    stopped = "search complete: tolerance met with no faster candidate left"
    for round_number in range(1, max_rounds + 1):
        specs = plan_round(round_number=round_number, model_facts=model_facts, device_isa=isa, backends=list(backends),
                           has_calibration=calibration_path is not None, tolerance=tolerance,
                           sensitivity=sensitivity, measured=entries)
        if not specs:
            break
        rounds = round_number
        for spec in specs:
            if time.monotonic() - started > time_budget_s:
                stopped = f"time budget of {time_budget_s:g} s ran out in round {round_number}"
                break
            out = work / "variants" / f"{spec['key']}.onnx"
            try:
                built = cached_build_variant(cache_dir=cache, model_path=model_path, precision=spec["precision"],
                                             out_path=out, calibration_path=calibration_path, options=spec["options"])
            except (NotApplicable, QuantizationError) as error:
                failures.append({"key": spec["key"], "error": str(error)})
                continue
            wanted = spec["backends"] or list(backends)
            for backend in [name for name in wanted if name in built["backends"] and name in backends]:
                entry = _measure(out, backend, spec, built, validation, settings, threads, work, tolerance, scoring)
                entries.append(entry)
        else:
            continue
        break
    else:
        if plan_round(round_number=max_rounds + 1, model_facts=model_facts, device_isa=isa, backends=list(backends),
                      has_calibration=calibration_path is not None, tolerance=tolerance,
                      sensitivity=sensitivity, measured=entries):
            stopped = f"stopped after max_rounds={max_rounds} with refinements left"

    _confirm_fastest(entries, validation, threads, work, confirm_windows)
    recommended, reason = scoring.recommend(entries, tolerance)
    pareto = scoring.pareto_ids(entries)
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
        "pareto": sorted(pareto),
        "rounds": rounds,
        "sensitivity": sensitivity,
        "tolerance": tolerance,
        "elapsed_s": time.monotonic() - started,
        "stopped": stopped,
    }


class _Validation:
    """Validation inputs (bounded), labels, and the FP32 reference outputs on them."""

    def __init__(self, model_path: str | Path, validation_path: str | Path, limit: int, declared: list[dict[str, Any]]):
        import onnxruntime as ort

        from workers.datasets import LABELS, iter_batches
        from workers.inspect import infer_output_kinds

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
        single = {name: np.ascontiguousarray(value[: self.static_batch or 1]) for name, value in self.batches[0].items()}
        self.benchmark_feeds = single

    def run(self, infer) -> dict[str, np.ndarray]:
        from devices.batching import sample_rows

        parts: dict[str, list[np.ndarray]] = {}
        for feeds in self.batches:
            rows = len(next(iter(feeds.values())))
            for name, value in infer(feeds).items():
                parts.setdefault(name, []).append(sample_rows(value, batch_size=rows, rows=rows))
        return {name: np.concatenate(values) for name, values in parts.items()}


def _confirm_fastest(entries: list[dict[str, Any]], validation: _Validation, threads: int | None, work: Path,
                     windows: int, margin: float = 0.10) -> None:
    """Re-time the passing variants within `margin` of the fastest, interleaved, so noise does not pick the winner.

    A single short run per candidate is enough to rule out the clearly slow ones, but near-ties on
    a busy machine flip from run to run; round-robin windows expose every contender to the same drift.
    """
    from devices.backends.registry import get_backend
    from devices.bench import BenchmarkSettings, measure, summarize_latencies

    passing = [e for e in entries if e.get("latency_ms") and e["accuracy"].get("within_tolerance") and e.get("path")]
    if windows < 1 or len(passing) < 2:
        return
    best = min(e["latency_ms"]["p50"] for e in passing)
    contenders = [e for e in passing if e["latency_ms"]["p50"] <= best * (1 + margin)]
    if len(contenders) < 2:
        return
    settings = BenchmarkSettings(warmup_runs=3, warmup_seconds=0.05, min_runs=10, min_seconds=0.25)
    compiled = [get_backend(e["backend"]).compile(e["path"], work / "confirm" / e["id"], threads=threads) for e in contenders]
    try:
        bound = [model.bind(validation.benchmark_feeds) for model in compiled]
        samples: list[list[np.ndarray]] = [[] for _ in contenders]
        for _ in range(windows):
            for index, run in enumerate(bound):
                samples[index].append(measure(run, settings)["samples_ms"])
        for entry, parts in zip(contenders, samples):
            entry["latency_ms_first_pass"] = entry["latency_ms"]
            medians = [float(np.median(part)) for part in parts]
            entry["latency_ms"] = {**summarize_latencies(np.concatenate(parts)), "p50": float(np.median(medians))}
            entry["confirmed"] = True
    finally:
        for model in compiled:
            model.close()


def _measure(path: Path, backend_name: str, spec: dict[str, Any], built: dict[str, Any], validation: _Validation,
             settings, threads: int | None, work: Path, tolerance: dict[str, Any], scoring) -> dict[str, Any]:
    from devices.backends.registry import get_backend
    from devices.bench import measure
    from devices.metrics import evaluate

    entry: dict[str, Any] = {
        "id": f"{spec['key']}@{backend_name}", "key": spec["key"], "backend": backend_name,
        "precision": spec["precision"], "options": spec["options"], "recipe": built["recipe"],
        "size_bytes": built["size_bytes"], "cache": built.get("cache"), "path": str(path),
        "latency_ms": None, "accuracy": {"value": None}, "error": None,
    }
    try:
        compiled = get_backend(backend_name).compile(path, work / "compiled" / entry["id"], threads=threads)
        try:
            outputs = validation.run(compiled.run)
            reference = {name: validation.reference[name] for name in validation.output_names}
            measured = evaluate({name: outputs[name] for name in reference}, reference, validation.plan, validation.labels)
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
