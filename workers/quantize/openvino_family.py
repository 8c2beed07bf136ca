"""The OpenVINO INT8 family: which OpenVINO IR variants a job builds, for explicit precisions and in the `auto` search.

OpenVINO's INT8 is built by NNCF on OpenVINO's own model (`workers.quantize.nncf_openvino`) and runs
only on OpenVINO, so it is planned only when a target has it and there is calibration data. Its key
says the runtime (`ov-int8`); its precision is the one that runs (`int8`). With its defaults it is
also the OpenVINO vendor baseline: `nncf.quantize` on an OpenVINO model, as OpenVINO's own guide
calls it. Pure planning: nothing here imports NNCF or OpenVINO.
"""

from __future__ import annotations

from typing import Any

from workers.quantize.entries import best_passing_p50, entry_accuracy, entry_p50, entry_passes
from workers.quantize.nncf_openvino import RUNTIME
from workers.quantize.schemes import is_transformer

KEYS = {"int8": "ov-int8"}
DEFAULT_KEY = KEYS["int8"]
TRANSFORMER_KEY = "ov-int8-transformer"


def openvino_spec(key: str = DEFAULT_KEY, **options: Any) -> dict[str, Any]:
    """The spec of an OpenVINO IR INT8 build with NNCF options (`model_type`, `preset`, ...)."""
    return {"key": key, "precision": "int8", "options": {"runtime": RUNTIME, **options}, "backends": [RUNTIME], "compile": {}}


def explicit_specs(precisions: list[str], *, backends: list[str] | set[str], has_calibration: bool) -> list[dict[str, Any]]:
    """The OpenVINO builds of a job's explicit precisions: INT8, when a target offers OpenVINO and there is calibration data."""
    if RUNTIME not in set(backends) or not has_calibration:
        return []
    return [openvino_spec(KEYS[precision]) for precision in precisions if precision in KEYS]


def search_proposals(state) -> list[dict[str, Any]]:
    """`auto` round 1 on targets with OpenVINO and calibration data: NNCF's INT8 with its defaults (and its transformer
    model type on a transformer). Later rounds add the transformer model type on any model whose default INT8 missed the
    tolerance yet beat the best passing variant (`default_misses_but_wins`); the search tries compile options on the
    fastest, and the plan leaves out what was measured already."""
    if state.round_number <= 1:
        return family_specs(state)
    return [spec for spec in family_specs(state) if spec["key"] == TRANSFORMER_KEY]


def family_specs(state) -> list[dict[str, Any]]:
    """The family's builds for the search's targets and model, in any round (the learned variants take them as templates)."""
    if RUNTIME not in state.backends or not state.has_calibration:
        return []
    specs = [openvino_spec()]
    if is_transformer(dict(state.model_facts.get("op_histogram") or {})) or default_misses_but_wins(state.measured):
        specs.append(openvino_spec(TRANSFORMER_KEY, model_type="transformer"))
    return specs


def default_misses_but_wins(measured: list[dict[str, Any]]) -> bool:
    """Whether NNCF's default INT8 on OpenVINO was measured outside the tolerance yet faster than every passing variant.
    NNCF's transformer model type then keeps in float the normalisation and elementwise patterns the default preset
    quantizes, wherever they come from: Magika's LayerNorm, exported by jax2tf as Sub/Square/Mul, is no LayerNormalization
    op, and NNCF's accuracy control reverts exactly those (2026-12-07: the default preset top-1 agreement 0.875, the
    transformer type 1.000 at the default's speed)."""
    timed = [entry for entry in measured if entry_p50(entry) is not None and entry_accuracy(entry) is not None]
    best_passing = best_passing_p50(timed)
    return any(entry["key"] == DEFAULT_KEY and entry.get("backend") == RUNTIME and not entry.get("compile") and not entry_passes(entry)
               and entry_p50(entry) < best_passing for entry in timed)
