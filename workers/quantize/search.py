"""`precisions: auto`: plan rounds of candidate variants, measure them, refine until the tolerance is met with nothing faster left.

`plan_round` is pure and deterministic: the pipeline calls it with what the devices measured, and
`search_locally` calls it with what this host measured (the benchmark uses that). Speed comes first:

- Round 1 measures FP32 on every backend and the cheapest member of each family the CPU's ISA
  proposes (`workers.quantize.isa_families`): one INT8 build per backend with per-tensor MinMax
  (beside it the same build with s8 activations where VNNI/AMX makes both schemes worth timing;
  the faster one sets the activations of the family's later recipes), INT8-dynamic and INT4
  weights where the graph has MatMuls, FP16 with native FP16 arithmetic, BF16 on bf16 units.
  Without integer dot products Kiln's INT8 recipes wait: only the vendor INT8 defaults are
  measured, and where one of them beats FP32 beyond noise the INT8 families are reopened (their
  probes and other recipes proposed in round 2, on those backends): evidence beats the prior.
- A family whose cheapest member is not faster than the best FP32 on the device, beyond the
  measured noise, is pruned on that backend (`family_verdicts` says why, "INT8 does not pay on this
  device: 0.89x"); a family that pays gets its other recipes (calibration methods, tools) there.
- Later rounds refine only candidates that missed the tolerance yet are faster than the best
  variant that met it: more of the most sensitive nodes in float (INT8), the most sensitive
  weights in INT8 (INT4). Keeping nodes in float only slows a variant down, so a family already
  slower than the best passing variant is never refined.
- Compile options (`devices.backends.options`) are search dimensions too: the best candidate per
  backend is tried with static shapes, thread counts and the runtime's hints, one option at a
  time, then with the options that each paid, combined.

A new family joins through `register_family`: a function that sees the round's `SearchState` and
proposes specs (the PyTorch-learned recipes use it).
"""

from __future__ import annotations

import logging
import math
import os
import re
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from devices import contract
from devices.agent.capabilities import cpu_isa
from devices.backends.options import describe as describe_compile_options
from devices.backends.registry import get_backend
from devices.batching import sample_rows
from devices.bench import INTERLEAVED_WINDOW, BenchmarkSettings, measure, rotated_order, summarize_latencies
from devices.cpus import usable_cores
from devices.labels import ignored_options
from devices.metrics import evaluate
from workers.datasets import LABELS, iter_batches
from workers.inspect import infer_output_kinds, inspect_onnx
from workers.learned.search import learned_proposals
from workers.quantize import litert_family, openvino_family
from workers.quantize.isa_families import S8, bf16_choice, fp16_choice, int8_choice, isa_notes
from workers.quantize.isolated import build_isolated, rank_nodes_isolated
from workers.quantize.round_budget import fit_round
from workers.quantize.runtimes import ONNX_READERS, ONNX_RUNTIMES, for_targets
from workers.quantize.schemes import TRANSFORMER_INT8_OPS, is_transformer, ort_int8_scheme
from workers.scoring import pareto_ids, recommend

logger = logging.getLogger(__name__)

KEEP_STEPS = (1, 2, 4, 8, 16, 32, 64)
_KEEP_SUFFIX = re.compile(r"^(?P<base>.+?)-keep(?P<k>\d+)$")
_MIX = re.compile(r"^int4-mix(?P<k>\d+)$")
_KEEP_FLOAT_OPS = {"int8": ("Conv", "ConvTranspose", "MatMul", "Gemm"), "int8-dynamic": ("MatMul", "Gemm")}
# The cheapest member of each family: what round 1 measures for speed before any accuracy work.
PROBES = {"int8": "int8-minmax", "int8-dynamic": "int8-dynamic", "int4-weight": "int4-rtn", "fp16": "fp16", "bf16": "bf16"}
# Where VNNI/AMX make both ONNX Runtime schemes worth timing, the INT8 probe has a twin with s8 activations (S8S8);
# the family's verdict takes the faster of the two.
S8_PROBE = "int8-minmax-s8"
PROBE_CHOICES = {**{precision: (probe,) for precision, probe in PROBES.items()}, "int8": (PROBES["int8"], S8_PROBE)}
# The families that need integer dot products to pay (`isa_families.int8_choice`); where the ISA has none, their verdict
# rests on the vendor INT8 defaults' evidence instead of their probe's (`family_verdicts`).
INT8_FAMILIES = ("int8", "int8-dynamic")
# Where Kiln's INT8 refinements keep the most sensitive nodes in float: its QDQ files on ONNX Runtime, NNCF's IR on OpenVINO.
KEEP_FLOAT_RUNTIMES = (*ONNX_READERS["int8"], openvino_family.RUNTIME)
# A runtime's own INT8 build (NNCF's OpenVINO IR, LiteRT's full-integer model) is the INT8 family on that runtime: Kiln's
# QDQ probe runs on ONNX Runtime alone, so OpenVINO's and LiteRT's INT8 are judged by what they run, not by ORT's probe.
NATIVE_INT8_KEYS = (openvino_family.DEFAULT_KEY, openvino_family.TRANSFORMER_KEY, litert_family.KEYS["int8"])
PROBE_EVIDENCE, VENDOR_EVIDENCE = "probe", "vendor defaults"
# bf16 is a family of its own: the FP32 graph under OpenVINO's bf16 inference precision, where the CPU has bf16 units.
# Its members are FP32 builds whose compile options define the family; ONNX Runtime's CPU provider has no such mode.
BF16_KEY = "bf16"
FAMILY_COMPILE = {BF16_KEY: {"inference_precision": "bf16"}}
# What a user gets without Kiln: onnxruntime's quantize_static and nncf.quantize called with their
# defaults (FP32 with runtime defaults is the "fp32" spec on every backend). They are measured in
# round 1 whatever the probes say, and re-timed beside the leader at the end, so Kiln's pick is
# never slower than a vendor default that meets the same tolerance.
VENDOR_DEFAULTS = ("fp32", "int8-ort-default", "int8-nncf", openvino_family.DEFAULT_KEY)
VENDOR_BUILD_TIMEOUT_S = 600.0
FAMILY_NAMES = {"int8": "INT8", "int8-dynamic": "INT8-dynamic", "int4-weight": "INT4 weights", "fp16": "FP16", "bf16": "BF16"}
# Below this relative gap two latencies are a tie, whatever their spread says.
NOISE_FLOOR = 0.03
COMPILE_SEPARATOR = "+"


InvalidTolerance = contract.InvalidSpec
parse_tolerance = contract.parse_tolerance


# ---------------------------------------------------------------------------------------------
# Planning


@dataclass
class SearchState:
    """What a family proposer sees: the round, the sweep of every recipe, what was measured and what pays."""

    round_number: int
    model_facts: dict[str, Any]
    device_isa: list[str]
    backends: list[str]
    has_calibration: bool
    sensitivity: list[dict[str, Any]]
    measured: list[dict[str, Any]]
    sweep: list[dict[str, Any]]
    verdicts: dict[str, dict[str, Any]] = field(default_factory=dict)
    # What the search has left of its time budget, in seconds (None: unknown); learning budgets are sized by it.
    seconds_left: float | None = None

    def paying_backends(self, precision: str) -> list[str]:
        """Backends where the family of `precision` beat FP32 beyond noise (all of them before it was measured)."""
        verdict = self.verdicts.get(precision)
        return list(self.backends) if verdict is None else list(verdict["paying_backends"])


FamilyProposer = Callable[[SearchState], list[dict[str, Any]]]
_FAMILY_PROPOSERS: list[FamilyProposer] = []


def register_family(proposer: FamilyProposer) -> FamilyProposer:
    """Add a family to the search: `proposer(state)` returns specs for this round (keys unique to the family)."""
    if proposer not in _FAMILY_PROPOSERS:
        _FAMILY_PROPOSERS.append(proposer)
    return proposer


def unregister_family(proposer: FamilyProposer) -> None:
    """Remove a family added by `register_family` (tests, plugins being unloaded)."""
    if proposer in _FAMILY_PROPOSERS:
        _FAMILY_PROPOSERS.remove(proposer)


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
    thread_choices: list[int] | None = None,
    seconds_left: float | None = None,
) -> list[dict[str, Any]]:
    """Candidate specs `{"key", "precision", "options", "backends", "compile"}` for this round; [] when the search is done.

    `model_facts` holds the graph's `op_histogram` and, for static-shape specialisation,
    `data_shapes` (`{input: [1, ...]}`, the shapes of the user's data at batch 1) and
    `dynamic_inputs` (the inputs with a dynamic dimension). `thread_choices` are the thread counts
    worth trying (the device's physical and logical cores); None when the caller pins threads.
    `seconds_left` is what the search has left of its time budget (None: unknown): learned variants' budgets follow it.
    """
    parse_tolerance(tolerance)
    sweep = _sweep(model_facts, list(device_isa), list(backends), has_calibration, measured)
    state = SearchState(round_number=round_number, model_facts=model_facts, device_isa=list(device_isa),
                        backends=list(backends), has_calibration=has_calibration, sensitivity=list(sensitivity or []),
                        measured=list(measured), sweep=sweep, seconds_left=seconds_left)
    if round_number <= 1:
        probes = _round_one_keys(device_isa)
        specs = [spec for spec in sweep if spec["key"] in probes]
        return for_targets(_acted_on(specs + _bf16_probe(state) + _registered(state)), backends)
    if not measured:
        return []
    state.verdicts = family_verdicts(measured, isa=device_isa)
    tried = {entry["key"] for entry in measured}
    proposals: dict[str, dict[str, Any]] = {}
    for spec in [*_paying_recipes(state), *_refinements(state), *_compile_candidates(state, thread_choices),
                 *_registered(state)]:
        if spec["key"] in tried:
            continue
        known = proposals.get(spec["key"])
        if known is None:
            proposals[spec["key"]] = spec
        elif known["backends"] and spec["backends"] and known["compile"] == spec["compile"]:
            # The same recipe with the same options proposed for two backends is one variant run on both.
            proposals[spec["key"]] = {**known, "backends": sorted(set(known["backends"]) | set(spec["backends"]))}
    return for_targets(_acted_on([proposals[key] for key in sorted(proposals)]), backends)


def _round_one_keys(isa: list[str]) -> set[str]:
    """What round 1 measures of the sweep: the vendor defaults always, the probes of the families the ISA proposes."""
    pruned = set() if int8_choice(isa).proposed else set(INT8_FAMILIES)
    probes = {key for precision, keys in PROBE_CHOICES.items() if precision not in pruned for key in keys}
    return probes | set(VENDOR_DEFAULTS)


def _bf16_probe(state: SearchState) -> list[dict[str, Any]]:
    """The bf16 family's probe: FP32 under OpenVINO's bf16 inference precision, on CPUs with bf16 units."""
    if "openvino" not in state.backends or not bf16_choice(state.device_isa).proposed:
        return []
    return [{**_spec(BF16_KEY, "fp32", {}, ["openvino"]), "compile": dict(FAMILY_COMPILE[BF16_KEY])}]


def _acted_on(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each spec on the backends that act on all of its compile options; a spec no backend acts on is not proposed
    (bf16 on ONNX Runtime's CPU provider would be FP32 measured under another name)."""
    kept = []
    for spec in specs:
        backends = spec.get("backends")
        if spec.get("compile") and backends:
            backends = [backend for backend in backends if not ignored_options(backend, spec["compile"])]
            if not backends:
                continue
        elif spec.get("compile") and any(ignored_options(backend, spec["compile"]) for backend in ("onnxruntime", "openvino")):
            backends = [backend for backend in ("onnxruntime", "openvino") if not ignored_options(backend, spec["compile"])]
        kept.append({**spec, "backends": backends})
    return kept


def _learned_family(state: SearchState) -> list[dict[str, Any]]:
    """Learned rounding and QAT (workers.learned) for the fastest calibrated INT8 family, of any runtime, that is faster
    than the best passing variant but misses the tolerance, with a learning budget from the gain and the time left."""
    if state.round_number <= 1:
        return []
    usable = [entry for entry in state.measured if _p50(entry) is not None and _accuracy(entry) is not None
              and not entry.get("compile")]
    best_passing = min((_p50(entry) for entry in usable if _passes(entry)), default=math.inf)
    templates = [*_with_smoothed(state.sweep), *openvino_family.family_specs(state)]
    proposals = learned_proposals(sweep=templates, measured=usable, best_passing=best_passing, seconds_left=state.seconds_left)
    specs = []
    for spec in proposals:
        backends = _learning_backends(spec, state)
        if backends:
            specs.append({**spec, "backends": backends, "compile": {}})
    return specs


def _learning_backends(spec: dict[str, Any], state: SearchState) -> list[str]:
    """Where a learned variant runs: a runtime's own format on that runtime (its family was measured there, faster than
    the best passing variant); an ONNX Runtime QDQ family on the backends where INT8 pays."""
    if (spec.get("options") or {}).get("runtime"):
        return [backend for backend in spec["backends"] if backend in state.backends]
    paying = state.paying_backends("int8")
    return [backend for backend in (spec["backends"] or paying) if backend in paying]


def _with_smoothed(sweep: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The sweep plus the smoothed transformer family, so that one measured outside the tolerance can be learned on too."""
    template = next((spec for spec in sweep if spec["key"] == SMOOTHED_BASE), None)
    return sweep if template is None else [*sweep, smoothed_spec(template)]


register_family(_learned_family)

# Kiln's transformer INT8 with smoothed Gemm/MatMul inputs (workers.quantize.smoothing) and the Gemm/MatMul outputs left in
# float (the consumers there, residual Adds and LayerNorms, are float anyway): proposed only once the calibrated transformer
# family was measured faster than the best passing variant yet outside the tolerance.
SMOOTHED_BASE = "int8-mse-transformer"
SMOOTHED_FAMILY = "int8-mse-transformer-smooth"
SMOOTHED_OPTIONS = {"smooth_quant": "auto", "float_outputs": ["Gemm", "MatMul"]}


def smoothed_spec(template: dict[str, Any]) -> dict[str, Any]:
    return {**template, "key": SMOOTHED_FAMILY, "options": {**template["options"], **SMOOTHED_OPTIONS}, "compile": {}}


def _smoothed_family(state: SearchState) -> list[dict[str, Any]]:
    paying = state.paying_backends("int8") if state.round_number > 1 else []
    template = next((spec for spec in state.sweep if spec["key"] == SMOOTHED_BASE), None)
    if not paying or template is None:
        return []
    usable = [entry for entry in state.measured if _p50(entry) is not None and _accuracy(entry) is not None and not entry.get("compile")]
    calibrated = [entry for entry in usable if entry["key"] == SMOOTHED_BASE]
    if not calibrated or any(_passes(entry) for entry in calibrated):
        return []
    best_passing = min((_p50(entry) for entry in usable if _passes(entry)), default=math.inf)
    if min(_p50(entry) for entry in calibrated) >= best_passing:
        return []
    return [{**smoothed_spec(template), "backends": paying}]


register_family(_smoothed_family)
# ONNX Runtime's INT8 written as QOperator (QLinearConv, QLinearMatMul, …) beside the QDQ graph it is made from: which one
# ORT runs faster depends on the model and the CPU (within 7% either way on four zoo models, 2026-12-02), so the fastest
# passing QDQ recipe of ORT's own quantizer is built once more as QOperator and measured there, where INT8 pays on ONNX
# Runtime; the decision keeps the faster. Learned and float-output variants stay QDQ (they are built on its graph).
QOPERATOR_SUFFIX = "-qop"


def _qoperator_format(state: SearchState) -> list[dict[str, Any]]:
    if state.round_number <= 1 or "onnxruntime" not in state.paying_backends("int8"):
        return []
    bases = [entry for entry in state.measured if entry.get("backend") == "onnxruntime" and entry.get("precision") == "int8"
             and _qdq_by_ort(entry.get("options") or {}) and not entry.get("compile") and _p50(entry) is not None and _passes(entry)]
    if not bases:
        return []
    base = min(bases, key=lambda entry: (_p50(entry), entry["key"]))
    return [_spec(f"{base['key']}{QOPERATOR_SUFFIX}", "int8", {**base["options"], "quant_format": "qoperator"}, ["onnxruntime"])]


def _qdq_by_ort(options: dict[str, Any]) -> bool:
    """A static INT8 graph written by ORT's own quantizer in QDQ format, which it can write as QOperator too."""
    return (options.get("tool", "onnxruntime") == "onnxruntime" and options.get("runtime") is None
            and options.get("quant_format", "qdq") == "qdq" and not options.get("learn") and not options.get("float_outputs")
            and not options.get("smooth_quant"))


register_family(_qoperator_format)
# LiteRT (workers.quantize.litert_family): its own builds, for targets that offer the runtime.
register_family(litert_family.search_proposals)
register_family(openvino_family.search_proposals)


def _registered(state: SearchState) -> list[dict[str, Any]]:
    specs = []
    for proposer in _FAMILY_PROPOSERS:
        try:
            specs.extend(proposer(state))
        except Exception:  # one family's planning bug must not stop the search
            logger.exception("family proposer %s failed", getattr(proposer, "__name__", proposer))
    return specs


def _paying_recipes(state: SearchState) -> list[dict[str, Any]]:
    """The other recipes of each family whose probe paid, on the backends where it paid."""
    specs = []
    # A family reopened by the vendor defaults' evidence never had its probe measured: the probe joins its recipes.
    reopened = {key for precision, verdict in state.verdicts.items() if verdict.get("evidence") == VENDOR_EVIDENCE
                for key in PROBE_CHOICES[precision]}
    for spec in state.sweep:
        if spec["key"] in VENDOR_DEFAULTS or (spec["key"] in _all_probe_keys() and spec["key"] not in reopened):
            continue
        paying = state.paying_backends(spec["precision"])
        if paying:
            specs.append({**spec, "backends": paying})
    template = next((spec for spec in state.sweep if spec["key"] == EARLY_KEEP_FAMILY), None)
    if template is not None and state.paying_backends("int8"):
        specs.extend({**spec, "backends": state.paying_backends("int8")}
                     for spec in _outlier_keep_specs(state.sweep, state.sensitivity))
    return specs


def _refinements(state: SearchState) -> list[dict[str, Any]]:
    # OpenVINO's own INT8 is refined the same way: NNCF keeps the ranked nodes in float (OpenVINO names its operations
    # after the ONNX nodes, so the ONNX ranking names them).
    templates = {spec["key"]: spec for spec in [*state.sweep, *openvino_family.family_specs(state)]}
    usable = [entry for entry in state.measured if _p50(entry) is not None and _accuracy(entry) is not None
              and not entry.get("compile")]
    passing = [_p50(entry) for entry in state.measured if _p50(entry) is not None and _accuracy(entry) is not None
               and _accuracy(entry).get("within_tolerance")]
    best_passing = min(passing) if passing else math.inf

    # The deepest refinement measured so far for each family, with its fastest latency and verdict.
    families: dict[str, dict[str, Any]] = {}
    for entry in usable:
        family, depth = _family(entry["key"])
        if family is None or entry.get("backend") not in state.paying_backends(entry.get("precision", "")):
            continue
        family_state = families.setdefault(family, {"depth": -1, "p50": math.inf, "passed": False})
        if depth > family_state["depth"]:
            family_state.update(depth=depth, p50=math.inf, passed=False)
        if depth == family_state["depth"]:
            family_state["p50"] = min(family_state["p50"], _p50(entry))
            family_state["passed"] = family_state["passed"] or bool(_accuracy(entry).get("within_tolerance"))

    specs = []
    for family in sorted(families):
        family_state = families[family]
        # Refining only adds float work, so a family at or above the best passing latency cannot win.
        if family_state["passed"] or family_state["p50"] >= best_passing:
            continue
        spec = _refine(family, family_state["depth"], templates, state.sensitivity)
        if spec is not None:
            paying = state.paying_backends(spec["precision"])
            specs.append({**spec, "backends": paying})
    return specs


def relative_noise(*entries: dict[str, Any]) -> float:
    """How far apart two p50s must be to differ: twice the combined standard error of the medians, at least NOISE_FLOOR."""
    variance = 0.0
    for entry in entries:
        latency = entry.get("latency_ms") or {}
        count = max(int(latency.get("count") or 1), 1)
        variance += (float(latency.get("cv") or 0.0) ** 2) * (math.pi / 2) / count
    return max(NOISE_FLOOR, 2.0 * math.sqrt(variance))


def _all_probe_keys() -> set[str]:
    return {key for keys in PROBE_CHOICES.values() for key in keys}


def family_verdicts(measured: list[dict[str, Any]], *, isa: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Per family (by precision): its probe's speed-up over the device's best FP32, per backend, and whether it pays.

    `{precision: {"family", "probe", "evidence", "speedup": {backend: x}, "fastest": {backend: key}, "paying_backends",
    "reason"}}`; a family whose probe failed to build or measure pays nowhere. INT8 is judged per runtime on that runtime's
    own build: ONNX Runtime by Kiln's QDQ probe, OpenVINO and LiteRT by their native INT8 (`NATIVE_INT8_KEYS`). Where
    `isa` has no integer dot products, the INT8 families' probes were never proposed: their evidence is then the vendor
    INT8 defaults measured beside FP32 (`evidence` "vendor defaults"), and where one of those pays the family is reopened
    on that backend.
    """
    fp32 = [entry for entry in measured if entry.get("precision") == "fp32" and _p50(entry) is not None
            and not entry.get("compile")]
    if not fp32:
        return {}
    best_fp32 = min(fp32, key=_p50)
    pruned = isa is not None and not int8_choice(isa).proposed
    vendor_int8 = [entry for entry in measured if is_vendor_default(entry) and entry.get("precision") == "int8"]
    verdicts: dict[str, dict[str, Any]] = {}
    for precision, probe in PROBES.items():
        entries = [entry for entry in measured if entry.get("key") in PROBE_CHOICES[precision]]
        evidence = PROBE_EVIDENCE
        if not entries and pruned and precision in INT8_FAMILIES:
            entries, evidence = vendor_int8, VENDOR_EVIDENCE
        elif precision == "int8":
            entries += [entry for entry in measured if entry.get("key") in NATIVE_INT8_KEYS and not entry.get("compile")]
        if not entries:
            continue
        speedup, fastest, paying = _speedups(entries, best_fp32)
        name = FAMILY_NAMES[precision]
        reason = _verdict_reason(name, evidence, speedup, paying, best_fp32) + _per_backend(speedup, fastest)
        verdicts[precision] = {"family": name, "probe": probe, "evidence": evidence, "speedup": speedup, "fastest": fastest,
                               "paying_backends": paying, "reason": reason}
    return verdicts


def ranking_pays(verdicts: dict[str, dict[str, Any]]) -> bool:
    """Whether ranking nodes by sensitivity can guide anything: it chooses the nodes Kiln's INT8 refinements keep in float,
    so it pays once INT8 paid on a runtime where Kiln refines it (ONNX Runtime's QDQ, OpenVINO's NNCF IR; not LiteRT)
    or INT8-dynamic paid."""
    readers = {"int8": KEEP_FLOAT_RUNTIMES, "int8-dynamic": ONNX_RUNTIMES}
    return any(set(verdicts.get(precision, {}).get("paying_backends") or []) & set(backends) for precision, backends in readers.items())


def _speedups(entries: list[dict[str, Any]], best_fp32: dict[str, Any]) -> tuple[dict[str, float], dict[str, str], list[str]]:
    """Per backend, the fastest entry's speed-up over the best FP32 and its key, and the backends where it is beyond noise."""
    fastest: dict[str, dict[str, Any]] = {}
    for entry in entries:
        backend = entry.get("backend")
        if _p50(entry) is not None and (backend not in fastest or _p50(entry) < _p50(fastest[backend])):
            fastest[backend] = entry
    speedup: dict[str, float] = {}
    paying: list[str] = []
    for backend in sorted(fastest, key=str):
        entry = fastest[backend]
        speedup[backend] = _p50(best_fp32) / _p50(entry)
        if speedup[backend] > 1.0 + relative_noise(entry, best_fp32):
            paying.append(backend)
    return speedup, {backend: fastest[backend].get("key", "") for backend in speedup}, paying


def _per_backend(speedup: dict[str, float], fastest: dict[str, str]) -> str:
    """Each runtime's own figure, where the family was measured on more than one ("onnxruntime int8-minmax 0.99x")."""
    if len(speedup) < 2:
        return ""
    return " (" + "; ".join(f"{backend} {fastest[backend]} {speedup[backend]:.2f}x" for backend in speedup) + ")"


def _verdict_reason(name: str, evidence: str, speedup: dict[str, float], paying: list[str], best_fp32: dict[str, Any]) -> str:
    best = max(speedup.values()) if speedup else None
    fp32_on = best_fp32.get("backend")
    if evidence == VENDOR_EVIDENCE:
        if paying:
            return (f"{name} reopened on {', '.join(paying)}: without integer dot products it was not proposed, but a vendor "
                    f"INT8 default ran up to {best:.2f}x the best FP32 ({fp32_on}), so Kiln's recipes are tried there")
        if best is None:
            return f"{name} not searched: no integer dot products, and no vendor INT8 default could be measured"
        return (f"{name} not searched: no integer dot products, and the vendor INT8 defaults confirm it: "
                f"{best:.2f}x the best FP32 ({fp32_on}), within noise or slower")
    if paying:
        dropped = [backend for backend in speedup if backend not in paying]
        elsewhere = f"; not on {', '.join(dropped)}, where it is not searched further" if dropped else ""
        return f"{name} pays on {', '.join(paying)}: up to {best:.2f}x the best FP32 on {fp32_on}{elsewhere}"
    if best is None:
        return f"{name} could not be measured on this device; not searched further"
    return (f"{name} does not pay on this device: {best:.2f}x the best FP32 "
            f"({fp32_on}), within noise or slower; not calibrated further")


def _compile_candidates(state: SearchState, thread_choices: list[int] | None) -> list[dict[str, Any]]:
    """Compile options for the fastest candidate on each backend: one at a time, then the ones that paid, combined."""
    specs = []
    by_key = {entry["key"]: entry for entry in state.measured}
    for backend in state.backends:
        base = _compile_base(state.measured, backend)
        if base is None:
            continue
        singles = _single_compile_options(state, backend, thread_choices)
        if base.get("precision") == "fp32":
            # The bf16 family is its own probe: the hint on an FP32 base would measure it again under another name.
            singles = [(tag, options) for tag, options in singles if "inference_precision" not in options]
        tried = []
        for tag, options in singles:
            key = f"{base['key']}{COMPILE_SEPARATOR}{tag}"
            specs.append(_compile_spec(base, key, options, backend))
            tried.append((tag, options, _measured_on(state.measured, key, backend)))
        winners = [(tag, options) for tag, options, entry in tried
                   if entry is not None and _p50(entry) is not None and _passes(entry)
                   and _p50(entry) * (1.0 + relative_noise(entry, base)) < _p50(base)]
        if len(winners) >= 2:
            combined: dict[str, Any] = {}
            for _, options in winners:
                combined.update(options)
            key = f"{base['key']}{COMPILE_SEPARATOR}{COMPILE_SEPARATOR.join(tag for tag, _ in winners)}"
            if key not in by_key:
                specs.append(_compile_spec(base, key, combined, backend))
    return specs


def _plain(entry: dict[str, Any]) -> bool:
    """A build with no compile options beyond those that define its family (bf16's inference precision)."""
    return (entry.get("compile") or {}) == FAMILY_COMPILE.get(str(entry.get("key")), {})


def _compile_base(measured: list[dict[str, Any]], backend: str) -> dict[str, Any] | None:
    """The fastest passing plain build on `backend` (FP32 when nothing passes there)."""
    plain = [entry for entry in measured if entry.get("backend") == backend and _plain(entry)
             and _p50(entry) is not None and _accuracy(entry) is not None]
    passing = [entry for entry in plain if _passes(entry)]
    pool = passing or [entry for entry in plain if entry.get("precision") == "fp32" and not entry.get("compile")]
    return min(pool, key=lambda entry: (_p50(entry), entry["key"])) if pool else None


def _single_compile_options(state: SearchState, backend: str, thread_choices: list[int] | None) -> list[tuple[str, dict[str, Any]]]:
    singles: list[tuple[str, dict[str, Any]]] = []
    shapes = state.model_facts.get("data_shapes") or {}
    dynamic = set(state.model_facts.get("dynamic_inputs") or [])
    static = {name: list(dims) for name, dims in shapes.items() if name in dynamic}
    # A LiteRT variant is built at the data's shapes already: specialising it again changes nothing.
    if static and backend != "litert":
        singles.append(("static", {"static_shapes": static}))
    for threads in sorted(set(thread_choices or [])):
        singles.append((f"threads{threads}", {"threads": int(threads)}))
    if backend == "onnxruntime":
        singles.append(("ort-extended", {"graph_optimization": "extended"}))
    if backend == "openvino":
        singles.append(("ov-throughput", {"performance_hint": "THROUGHPUT"}))
        if bf16_choice(state.device_isa).proposed:
            singles.append(("ov-bf16", {"inference_precision": "bf16"}))
    return singles


def _compile_spec(base: dict[str, Any], key: str, options: dict[str, Any], backend: str) -> dict[str, Any]:
    return {"key": key, "precision": base["precision"], "options": dict(base.get("options") or {}),
            "backends": [backend], "compile": {**(base.get("compile") or {}), **options}}


def _measured_on(measured: list[dict[str, Any]], key: str, backend: str) -> dict[str, Any] | None:
    return next((entry for entry in measured if entry.get("key") == key and entry.get("backend") == backend), None)


def _passes(entry: dict[str, Any]) -> bool:
    accuracy = _accuracy(entry)
    return bool(accuracy and accuracy.get("within_tolerance"))


def compile_winners(measured: list[dict[str, Any]]) -> list[str]:
    """One line per backend where a compile option beat its base build: which options, how much faster."""
    lines = []
    for backend in sorted({entry.get("backend") for entry in measured if entry.get("compile")}):
        tuned = [entry for entry in measured if entry.get("backend") == backend and entry.get("compile")
                 and _p50(entry) is not None and _passes(entry)]
        if not tuned:
            continue
        best = min(tuned, key=_p50)
        base_key = best["key"].split(COMPILE_SEPARATOR)[0]
        base = _measured_on(measured, base_key, backend)
        if base is None or _p50(base) is None:
            continue
        ratio = _p50(base) / _p50(best)
        verdict = "won" if ratio > 1.0 + relative_noise(best, base) else "did not pay (within noise or slower)"
        lines.append(f"{backend}: {describe_compile_options(best['compile'])} {verdict}: {ratio:.2f}x {base_key} with runtime defaults")
    return lines


def _sweep(model_facts: dict[str, Any], isa: list[str], backends: list[str], has_calibration: bool,
           measured: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ops = dict(model_facts.get("op_histogram") or {})
    transformer = is_transformer(ops)
    scheme = ort_int8_scheme(isa)
    probe_options = {"activation_type": scheme["activation_type"], "weight_type": scheme["weight_type"],
                     "reduce_range": scheme["reduce_range"]}
    activation = _int8_activation(scheme, measured)
    # The later recipes follow the probe twin that won on this device (the ISA's scheme unless s8 was faster).
    scheme_options = probe_options if activation == scheme["activation_type"] else _S8_OPTIONS
    specs = [_spec("fp32", "fp32", {})]
    if fp16_choice(isa).proposed:
        specs.append(_spec("fp16", "fp16", {}))
    if "MatMul" in ops or "Gemm" in ops:
        specs.append(_spec("int8-dynamic", "int8-dynamic", {}))
    if has_calibration:
        # What onnxruntime's quantize_static gives with its defaults (per-tensor MinMax QDQ), in the
        # device's integer scheme: the vendor baseline every other candidate must beat.
        specs.append(_spec("int8-minmax", "int8", {"calibration_method": "minmax", "per_channel": False, **probe_options}))
        if S8 in int8_choice(isa).activations and scheme["activation_type"] != S8:
            specs.append(_spec(S8_PROBE, "int8", {"calibration_method": "minmax", "per_channel": False, **_S8_OPTIONS}))
        # quantize_static exactly as a user calls it (its own integer types and symmetry, no preprocessing).
        specs.append(_spec("int8-ort-default", "int8", {"tool": "onnxruntime-defaults"}))
        specs.append(_spec("int8-mse", "int8", {"calibration_method": "mse", "per_channel": True, **scheme_options}))
        specs.append(_spec("int8-entropy", "int8", {"calibration_method": "entropy", "calibrator": "kiln",
                                                    "per_channel": True, **scheme_options}))
        # NNCF's ONNX backend with its defaults (a QDQ file for ONNX Runtime; OpenVINO's own baseline is NNCF on the
        # OpenVINO model, workers.quantize.openvino_family).
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


# ONNX Runtime's S8S8: signed activations and weights, full 8-bit range (VNNI and Arm accumulate without saturation).
_S8_OPTIONS = {"activation_type": S8, "weight_type": "int8", "reduce_range": False}


def _int8_activation(scheme: dict[str, Any], measured: list[dict[str, Any]]) -> str:
    """The activation type of Kiln's later INT8 recipes: the ISA scheme's, unless the s8 probe beat the scheme's probe
    beyond noise on a backend of this device."""
    for backend in sorted({str(entry.get("backend")) for entry in measured}):
        u8, s8 = _measured_on(measured, PROBES["int8"], backend), _measured_on(measured, S8_PROBE, backend)
        if u8 is None or s8 is None or _p50(u8) is None or _p50(s8) is None:
            continue
        if _p50(s8) * (1.0 + relative_noise(u8, s8)) < _p50(u8):
            return S8
    return scheme["activation_type"]


def _spec(key: str, precision: str, options: dict[str, Any], backends: list[str] | None = None) -> dict[str, Any]:
    return {"key": key, "precision": precision, "options": options, "backends": backends, "compile": {}}


def _family(key: str) -> tuple[str | None, int]:
    """(family, depth): "int8-mse-keep4" → ("int8-mse", 4); "int4-mix2" → ("int4-rtn", 2); "int8-mse" → ("int8-mse", 0)."""
    if key in ("fp32", "fp16", BF16_KEY, "int8-ort-default") or COMPILE_SEPARATOR in key:
        # The ORT-defaults baseline takes no options: keeping nodes in float is the other recipes' job.
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
    if template["options"].get("runtime") == openvino_family.RUNTIME:
        # NNCF places OpenVINO's FakeQuantize nodes itself; it is told only which nodes stay in float.
        return _spec(f"{family}-keep{len(chosen)}", template["precision"], {**template["options"], "nodes_to_exclude": chosen},
                     template["backends"])
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
    (default: the CPU count). The search stops when `time_budget_s` is spent and reports the best so far.

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
        if round_number > 1 and sensitivity is None and calibration_path is not None and ranking_pays(family_verdicts(entries, isa=isa)):
            # Sensitivity feeds only INT8's refinements: computed once INT8 has shown it can win.
            sensitivity = _rank_nodes_safely(model_path, calibration_path, sensitivity_samples, memory_budget_mb, failures)
        specs = plan_round(round_number=round_number, model_facts=model_facts, device_isa=isa, backends=list(backends),
                           has_calibration=calibration_path is not None, tolerance=tolerance,
                           sensitivity=sensitivity, measured=entries, thread_choices=thread_choices,
                           seconds_left=deadline - time.monotonic())
        if not specs:
            break
        if round_number > max_rounds:
            stopped = f"stopped after max_rounds={max_rounds} with refinements left"
            break
        if time.monotonic() >= deadline:
            stopped = f"time budget of {time_budget_s:g} s ran out before round {round_number}; reporting the best so far"
            break
        fitted = fit_round(specs, round_number=round_number, seconds_left=deadline - time.monotonic(),
                           elapsed_s=time.monotonic() - started, measurements=len(entries))
        budget_notes.extend([fitted.note] if fitted.note else [])
        if not fitted.kept:
            stopped = (f"time budget of {time_budget_s:g} s: what is left would not cover round {round_number}'s candidates; "
                       "reporting the best so far")
            break
        specs = fitted.kept
        rounds = round_number
        fresh = _build_round([spec for spec in specs if _recipe_key(spec) not in recipes], model_path, calibration_path,
                             work, cache, workers, memory_budget_mb, deadline, failures)
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
                if time.monotonic() >= deadline and spec["key"] not in VENDOR_DEFAULTS:
                    out_of_time = True
                    break
                entries.append(_measure(out, backend, spec, result, validation, settings, threads, work, tolerance))
        if out_of_time or len(built) < len(specs) and time.monotonic() >= deadline:
            stopped = f"time budget of {time_budget_s:g} s ran out in round {round_number}; reporting the best so far"
            break

    # What pruned the search was decided on the first-pass timings: the notes say so before re-timing.
    notes = (isa_notes(isa) + [verdict["reason"] for verdict in family_verdicts(entries, isa=isa).values()] + compile_winners(entries)
             + budget_notes)
    _confirm_fastest(entries, validation, threads, work, confirm_windows)
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

    def run(self, infer, *, rows_per_call: int | None = None) -> dict[str, np.ndarray]:
        """Every validation sample through `infer`, `rows_per_call` rows at a time (a static-shape build) or whole batches."""
        parts: dict[str, list[np.ndarray]] = {}
        for batch in self.batches:
            total = len(next(iter(batch.values())))
            step = rows_per_call or total
            for start in range(0, total, step):
                feeds = {name: np.ascontiguousarray(value[start : start + step]) for name, value in batch.items()}
                rows = len(next(iter(feeds.values())))
                for name, value in infer(feeds).items():
                    parts.setdefault(name, []).append(sample_rows(value, batch_size=rows, rows=rows))
        return {name: np.concatenate(values) for name, values in parts.items()}


def is_vendor_default(entry: dict[str, Any]) -> bool:
    """Whether a measured entry is a configuration a user gets without Kiln (VENDOR_DEFAULTS, runtime defaults)."""
    return entry.get("key") in VENDOR_DEFAULTS and not entry.get("compile")


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
                     windows: int, max_windows: int = 15) -> None:
    """Re-time the contenders (`confirmation_contenders`) side by side, until the leader is clear or `max_windows`.

    Rounds are measured minutes apart, and on a busy machine the load drifts between them, so
    first-pass timings from different rounds do not compare. The contenders are timed again in
    round-robin windows so every one sees the same drift; after `windows` rounds, more are added
    while the leader's 90% interval (bootstrap over the window medians) overlaps a rival's. Each
    contender's p50 becomes the median of its window medians, with the interval as `p50_ci`, and
    its window medians go to `timing.interleaved_medians_ms` (paired across contenders: the
    recommendation judges ties by the per-window ratios, workers/noise.py). The others are scaled by
    the drift the contenders saw (`drift_adjusted`).
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
        for done in range(1, max_windows + 1):
            for index in rotated_order(len(bound), done - 1):
                samples[index].append(measure(bound[index], settings)["samples_ms"])
            if done >= windows and _leader_is_clear(samples):
                break
        drifts = []
        for entry, parts in zip(contenders, samples):
            entry["latency_ms_first_pass"] = entry["latency_ms"]
            medians = [float(np.median(part)) for part in parts]
            entry["latency_ms"] = {**summarize_latencies(np.concatenate(parts)), "p50": float(np.median(medians))}
            entry["p50_ci"] = list(median_interval(medians))
            entry["timing"] = {**(entry.get("timing") or {}), "interleaved_medians_ms": medians}
            entry["confirmed"] = len(medians)
            drifts.append(entry["latency_ms"]["p50"] / entry["latency_ms_first_pass"]["p50"])
    finally:
        for model in compiled:
            model.close()
    drift = float(np.median(drifts))
    for entry in entries:
        if entry.get("latency_ms") and not entry.get("confirmed"):
            entry["latency_ms_first_pass"] = entry["latency_ms"]
            entry["latency_ms"] = {**entry["latency_ms"], "p50": entry["latency_ms"]["p50"] * drift}
            entry["drift_adjusted"] = drift


def median_interval(values: list[float], confidence: float = 0.90, resamples: int = 2000) -> tuple[float, float]:
    """A bootstrap confidence interval of the median of `values` (deterministic: a fixed seed)."""
    data = np.asarray(values, dtype=np.float64)
    if data.size < 2:
        return float(data[0]), float(data[0])
    rng = np.random.default_rng(0)
    medians = np.median(data[rng.integers(0, data.size, (resamples, data.size))], axis=1)
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(medians, [tail, 1.0 - tail])
    return float(low), float(high)


def _leader_is_clear(samples: list[list[np.ndarray]]) -> bool:
    """Whether the contender with the lowest median window median is below every rival's interval."""
    medians = [[float(np.median(part)) for part in parts] for parts in samples]
    intervals = [median_interval(values) for values in medians]
    leader = min(range(len(medians)), key=lambda index: float(np.median(medians[index])))
    return all(intervals[leader][1] < intervals[index][0] for index in range(len(medians)) if index != leader)


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
        compiled = get_backend(backend_name).compile(path, work / "compiled" / entry["id"], threads=threads, options=compile_options)
        try:
            static_batch = max((spec.static_batch or 0 for spec in compiled.input_specs), default=0)
            outputs = validation.run(compiled.run, rows_per_call=static_batch or None)
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
