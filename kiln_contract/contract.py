"""The accuracy contract: precisions, output kinds, metrics, tolerances and the verdict.

One module, imported by the API (parsing a job), the search (planning and judging candidates),
the agent (what to compute for each output) and the report (the verdict). It is plain Python
with no Django, so the agent installs without the server; the server turns `InvalidSpec` into a
400 with the code it carries.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

# `bf16` is not a storage precision: it is FP32's build run under OpenVINO's bf16 inference precision (the family
# `auto` tries on CPUs with bf16 units), asked for by name.
PRECISIONS = ("fp32", "bf16", "fp16", "int8", "int8-dynamic", "int4-weight")
BF16 = "bf16"
AUTO = "auto"

# What an output is, and so how it is judged.
OUTPUT_KINDS = ("class_scores", "class_ids", "probability_map", "heat_map", "distribution", "dense", "embedding", "detection",
                "regression")


@dataclass(frozen=True)
class Metric:
    """One figure an agent measures. `better` says which way is good; `ideal` is FP32 against itself."""

    name: str
    better: str  # "higher" or "lower"
    ideal: float | None
    description: str
    labels: bool = False  # needs the validation set's labels


METRICS: dict[str, Metric] = {metric.name: metric for metric in (
    Metric("top1_agreement", "higher", 1.0, "share of positions whose top class matches FP32 (ties in FP32 not counted)"),
    Metric("top5_agreement", "higher", 1.0, "mean overlap of the top-5 classes with FP32's"),
    Metric("id_agreement", "higher", 1.0, "share of predicted ids equal to FP32's"),
    Metric("mask_iou", "higher", 1.0, "IoU of the thresholded foreground with FP32's"),
    Metric("relative_l2", "lower", 0.0, "||output - FP32|| / ||FP32||"),
    Metric("sqnr_db", "higher", None, "signal-to-quantization-noise ratio against FP32, dB"),
    Metric("cosine", "higher", 1.0, "cosine similarity with FP32 over the whole output"),
    Metric("cosine_mean", "higher", 1.0, "mean cosine similarity per vector"),
    Metric("cosine_p5", "higher", 1.0, "5th percentile of the cosine similarity per vector (the worst vectors)"),
    Metric("sentence_cosine_mean", "higher", 1.0, "mean cosine of the mask-weighted mean-pooled sentence embeddings"),
    Metric("sentence_cosine_p5", "higher", 1.0, "5th percentile of the cosine of the mean-pooled sentence embeddings"),
    Metric("neighbour_agreement", "higher", 1.0, "share of samples whose nearest other sample (cosine) is the one FP32 finds"),
    Metric("region_f1", "higher", 1.0, "F1 of the thresholded regions (connected areas) matched to FP32's at IoU >= 0.5"),
    Metric("peak_agreement", "higher", 1.0, "share of rows or maps whose peak is where FP32's is (one bin; 2% of the map's side)"),
    Metric("decoded_agreement", "higher", 1.0, "share of rows whose value decoded around the peak is within half a bin of FP32's"),
    Metric("decoded_error_bins", "lower", 0.0, "mean distance in bins between the decoded value and FP32's"),
    Metric("detection_f1", "higher", 1.0, "F1 of detections matched to FP32's (IoU >= match_iou, same class)"),
    Metric("detection_recall", "higher", 1.0, "share of FP32's detections found"),
    Metric("detection_precision", "higher", 1.0, "share of detections that FP32 also made"),
    Metric("box_iou", "higher", 1.0, "mean IoU of matched boxes"),
    Metric("top1_accuracy", "higher", None, "top-1 accuracy against the labels", labels=True),
    Metric("top5_accuracy", "higher", None, "top-5 accuracy against the labels", labels=True),
    Metric("mean_iou", "higher", None, "mean IoU over classes against label masks", labels=True),
    Metric("sequence_accuracy", "higher", None, "share of CTC-decoded sequences equal to the label", labels=True),
    Metric("cer", "lower", None, "character error rate of CTC-decoded sequences against the labels", labels=True),
    Metric("plugin", "higher", None, "a metric plugin's value (entry point group kiln.metrics), FP32's value as reference"),
)}

# Per kind: the metric the tolerance uses, then every metric the agent reports. Token vectors of an
# encoder fed an attention mask are judged on the kept tokens only (kiln_contract.metrics.token_view), and
# the headline stays `cosine_p5` over those tokens rather than the mean-pooled sentence cosine
# (reported beside it as `sentence_cosine_*`; declare `sentence_cosine` to be judged by it): the
# graph does not say how its hidden states are pooled (mean, CLS token, a token head), and a 5th
# percentile over hundreds of tokens is steadier than over the tens of sentences of a validation set.
KIND_METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "class_scores": ("top1_agreement", ("top1_agreement", "top5_agreement", "sqnr_db")),
    "class_ids": ("id_agreement", ("id_agreement",)),
    "probability_map": ("mask_iou", ("mask_iou", "sqnr_db", "relative_l2")),
    # A single-channel map users threshold into regions (text, saliency): a lost region or a moved peak is what matters,
    # which the mask IoU of a large foreground barely shows.
    "heat_map": ("region_f1", ("region_f1", "peak_agreement", "mask_iou", "sqnr_db")),
    # Values over ordered bins decoded around the peak (a pitch over cents bins): the decoded value is the answer.
    "distribution": ("decoded_agreement", ("decoded_agreement", "peak_agreement", "decoded_error_bins", "sqnr_db")),
    "dense": ("relative_l2", ("relative_l2", "sqnr_db")),
    "embedding": ("cosine_p5", ("cosine_mean", "cosine_p5", "neighbour_agreement", "sqnr_db")),
    "detection": ("detection_f1", ("detection_f1", "detection_recall", "detection_precision", "box_iou")),
    "regression": ("relative_l2", ("relative_l2", "sqnr_db")),
}

# What a job may declare per output (`"kind"` in a declared metric): a kind's metric family, a
# label metric, or a plugin. Each names the figure the tolerance reads.
DECLARABLE: dict[str, str] = {
    "top1_agreement": "top1_agreement", "top5_agreement": "top5_agreement", "id_agreement": "id_agreement",
    "mask_iou": "mask_iou", "relative_l2": "relative_l2", "sqnr": "sqnr_db", "cosine": "cosine_p5",
    "sentence_cosine": "sentence_cosine_p5", "neighbours": "neighbour_agreement",
    "regions": "region_f1", "peak": "peak_agreement", "decoded": "decoded_agreement",
    "detection": "detection_f1",
    "accuracy": "top1_accuracy", "top5_accuracy": "top5_accuracy", "mean_iou": "mean_iou", "ctc": "sequence_accuracy",
    "plugin": "plugin",
}
LABEL_DECLARATIONS = ("accuracy", "top5_accuracy", "mean_iou", "ctc")

# Tolerance metrics a job may name; each maps to a figure (auto: each primary output's own).
TOLERANCE_METRICS = ("auto", "accuracy", "cosine", "sqnr", "top1_agreement", "mask_iou", "relative_l2", "detection_f1", "cer",
                     "sequence_accuracy", "mean_iou", "region_f1", "decoded_agreement")
TOLERANCE_FIGURES = {"accuracy": "top1_accuracy", "cosine": "cosine", "sqnr": "sqnr_db", "top1_agreement": "top1_agreement",
                     "mask_iou": "mask_iou", "relative_l2": "relative_l2", "detection_f1": "detection_f1", "cer": "cer",
                     "sequence_accuracy": "sequence_accuracy", "mean_iou": "mean_iou", "region_f1": "region_f1",
                     "decoded_agreement": "decoded_agreement"}
DEFAULT_TOLERANCE = {"metric": "auto", "max_drop": 0.01}
DEFAULT_MIN_SQNR_DB = 30.0
EPSILON = 1e-9

# Defaults of the per-kind metrics; a declared metric may change them within these ranges.
DEFAULT_MASK_THRESHOLD = 0.5
DEFAULT_SCORE_THRESHOLD = 0.25
DEFAULT_MATCH_IOU = 0.5
DEFAULT_NMS_IOU = 0.45
MAX_DECLARED_METRICS = 32
PLUGIN_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,100}$")


class InvalidSpec(ValueError):
    """A tolerance or metric declaration that cannot be understood; `code` is the API's error code."""

    def __init__(self, message: str, code: str = "invalid_tolerance"):
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------------------------------------
# Tolerance


def parse_tolerance(raw: Any) -> dict[str, Any]:
    """Normalize a tolerance: `{"metric", "max_drop"}` (`min_value` for sqnr), a bare number, or text like "1%" or "cosine:0.5%"."""
    if raw in (None, {}, ""):
        return dict(DEFAULT_TOLERANCE)
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        raw = {"max_drop": raw}
    if isinstance(raw, str):
        metric, _, amount = raw.rpartition(":")
        raw = {"metric": metric.strip() or AUTO, "max_drop": amount.strip()}
    if not isinstance(raw, dict):
        raise InvalidSpec('tolerance must be an object like {"metric": "auto", "max_drop": 0.01}.')
    metric = raw.get("metric", AUTO)
    metric = metric.strip().lower() if isinstance(metric, str) else metric
    if metric not in TOLERANCE_METRICS:
        raise InvalidSpec(f"Unknown tolerance metric {metric!r}; use one of {', '.join(TOLERANCE_METRICS)}.")
    if metric == "sqnr":
        return {"metric": metric, "min_value": _number(raw.get("min_value", DEFAULT_MIN_SQNR_DB), "tolerance.min_value", low=-1e3, high=1e3)}
    max_drop = _number(raw.get("max_drop", DEFAULT_TOLERANCE["max_drop"]), "tolerance.max_drop", low=0.0, high=1.0, percent=True)
    return {"metric": metric, "max_drop": max_drop}


def _number(value: Any, name: str, *, low: float, high: float, percent: bool = False, code: str = "invalid_tolerance") -> float:
    if isinstance(value, bool) or value is None:
        raise InvalidSpec(f"{name} must be a number.", code)
    text = str(value).strip()
    if len(text) > 64:
        raise InvalidSpec(f"{name} must be a number between {low:g} and {high:g}.", code)
    try:
        number = float(text[:-1]) / 100.0 if percent and text.endswith("%") else float(text)
    except ValueError:
        raise InvalidSpec(f"{name} must be a number, got {value!r}.", code) from None
    if not math.isfinite(number):
        raise InvalidSpec(f"{name} must be finite.", code)
    if not low <= number <= high:
        hint = " (a fraction: 0.01 = one point)" if percent else ""
        raise InvalidSpec(f"{name} must be between {low:g} and {high:g}{hint}, got {number:g}.", code)
    return number


# ---------------------------------------------------------------------------------------------
# Declared metrics


def parse_declared_metrics(raw: Any, *, outputs: list[str]) -> list[dict[str, Any]]:
    """Check a job's `metrics` list against the model's output names; returns normalized entries.

    Each entry: `{"output", "kind", "primary", ...options}` where options are `threshold`
    (mask_iou, detection), `match_iou` and `nms_iou` (detection), `blank` (ctc), `plugin`.
    """
    if raw in (None, []):
        return []
    if not isinstance(raw, list):
        raise InvalidSpec('metrics must be a list like [{"output": "...", "kind": "mask_iou", "primary": true}].', "invalid_metrics")
    if len(raw) > MAX_DECLARED_METRICS:
        raise InvalidSpec(f"At most {MAX_DECLARED_METRICS} declared metrics.", "invalid_metrics")
    parsed = [_parse_declared(index, item, outputs) for index, item in enumerate(raw)]
    seen = set()
    for entry in parsed:
        key = (entry["output"], entry["kind"], entry.get("plugin"))
        if key in seen:
            raise InvalidSpec(f"metrics: {entry['kind']} is declared twice for output {entry['output']!r}.", "invalid_metrics")
        seen.add(key)
    return parsed


_OPTION_RANGES = {
    "threshold": (0.0, 1.0),
    "match_iou": (0.05, 1.0),
    "nms_iou": (0.05, 1.0),
}
_KIND_OPTIONS = {"mask_iou": {"threshold"}, "regions": {"threshold"}, "mean_iou": {"threshold"}, "detection": {"threshold", "match_iou", "nms_iou"}, "ctc": {"blank"},
                 "plugin": {"plugin"}}


def _parse_declared(index: int, item: Any, outputs: list[str]) -> dict[str, Any]:
    where = f"metrics[{index}]"
    if not isinstance(item, dict):
        raise InvalidSpec(f"{where} must be an object with output and kind.", "invalid_metrics")
    output, kind = item.get("output"), item.get("kind")
    if not isinstance(output, str) or output not in outputs:
        raise InvalidSpec(f"{where}: the model has no output {output!r}; its outputs are {', '.join(outputs)}.", "unknown_output")
    if kind not in DECLARABLE:
        raise InvalidSpec(f"{where}: unknown metric kind {kind!r}; use one of {', '.join(DECLARABLE)}.", "invalid_metrics")
    unknown = set(item) - {"output", "kind", "primary"} - _KIND_OPTIONS.get(kind, set())
    if unknown:
        raise InvalidSpec(f"{where}: {kind} takes no {', '.join(sorted(unknown))}.", "invalid_metrics")
    entry: dict[str, Any] = {"output": output, "kind": kind, "primary": item.get("primary", False)}
    if not isinstance(entry["primary"], bool):
        raise InvalidSpec(f"{where}.primary must be true or false.", "invalid_metrics")
    for option in ("threshold", "match_iou", "nms_iou"):
        if option in item:
            low, high = _OPTION_RANGES[option]
            value = _number(item[option], f"{where}.{option}", low=low, high=high, code="invalid_metrics")
            if option == "threshold" and not 0.0 < value < 1.0:
                raise InvalidSpec(f"{where}.threshold must be strictly between 0 and 1, got {value:g}.", "invalid_metrics")
            entry[option] = value
    if kind == "ctc":
        blank = item.get("blank")
        if isinstance(blank, bool) or not isinstance(blank, int) or not 0 <= blank < 1_000_000:
            raise InvalidSpec(f"{where}: ctc needs the blank index (an integer >= 0), e.g. \"blank\": 0.", "invalid_metrics")
        entry["blank"] = blank
    if kind == "plugin":
        name = item.get("plugin")
        if not isinstance(name, str) or not PLUGIN_NAME.match(name):
            raise InvalidSpec(f"{where}: plugin needs the entry point's name in group kiln.metrics (letters, digits, _ . -).", "invalid_metrics")
        entry["plugin"] = name
    return entry


def declared_figure(entry: dict[str, Any]) -> str:
    """The figure a declared metric's tolerance reads."""
    return DECLARABLE[entry["kind"]]


# ---------------------------------------------------------------------------------------------
# The evaluation plan an agent follows


def evaluation_plan(*, output_kinds: dict[str, dict[str, Any]], output_order: list[str], declared: list[dict[str, Any]],
                    has_labels: bool) -> dict[str, Any]:
    """What to measure per output and which outputs the tolerance reads.

    `output_kinds` maps each output to `{"kind", ...options}` (inferred or overridden). Declared
    primaries decide; without any, the first output is primary (an auxiliary output must not
    decide), and with labels the label metric is measured on the first output it fits.
    """
    outputs = []
    primaries = {entry["output"] for entry in declared if entry["primary"]}
    for name in output_order:
        info = output_kinds.get(name) or {"kind": "regression"}
        kind = info["kind"] if info.get("kind") in OUTPUT_KINDS else "regression"
        options = {key: value for key, value in info.items() if key not in ("kind", "reason", "source")}
        outputs.append({"name": name, "kind": kind, "options": options, "primary": name in primaries if primaries else name == output_order[0],
                        "declared": [entry for entry in declared if entry["output"] == name]})
    return {"outputs": outputs, "labels": has_labels, "declared_primary": bool(primaries)}


# ---------------------------------------------------------------------------------------------
# The verdict


def figure_drop(figure: str, value: float, reference: float | None) -> float | None:
    """How far a measured figure is from its reference, positive = worse."""
    metric = METRICS.get(figure) or METRICS["plugin"]
    if reference is None:
        reference = metric.ideal
    if reference is None:
        return None
    return reference - value if metric.better == "higher" else value - reference


def _legacy_rows(tolerance: dict[str, Any], accuracy: dict[str, Any]) -> list[dict[str, Any]]:
    """A flat payload from an agent of an earlier release: worst-over-outputs figures, labels first."""
    metric = tolerance.get("metric", AUTO)
    if metric == AUTO:
        figure = next((key for key in ("accuracy", "top1_agreement") if accuracy.get(key) is not None), "cosine")
    else:
        figure = {"accuracy": "accuracy", "sqnr": "sqnr_db"}.get(metric, metric)
    reference = accuracy.get("reference_accuracy") if figure == "accuracy" else None
    return [{"output": accuracy.get("labeled_output"), "figure": "top1_accuracy" if figure == "accuracy" else figure,
             "value": accuracy.get(figure), "reference": reference, "error": None}]


def _candidates(tolerance: dict[str, Any], accuracy: dict[str, Any]) -> list[dict[str, Any]]:
    """(output, figure, value, reference) for each primary figure the tolerance reads."""
    metric = tolerance.get("metric", AUTO)
    outputs = accuracy.get("outputs")
    if not isinstance(outputs, dict) or not any(isinstance(result, dict) and "primary" in result for result in outputs.values()):
        return _legacy_rows(tolerance, accuracy)
    rows = []
    for name, result in (accuracy.get("outputs") or {}).items():
        if not isinstance(result, dict) or not result.get("primary"):
            continue
        figures = result.get("metrics") or {}
        references = result.get("reference") or {}
        if metric == AUTO:
            figure = result.get("primary_metric")
        else:
            figure = TOLERANCE_FIGURES[metric]
        if figure is None:
            continue
        rows.append({"output": name, "figure": figure, "value": figures.get(figure), "reference": references.get(figure),
                     "error": (result.get("errors") or {}).get(figure) or (result.get("errors") or {}).get("labels")})
    return rows


def score_accuracy(tolerance: dict[str, Any], accuracy: dict[str, Any]) -> dict[str, Any]:
    """The tolerance verdict for one variant's measured accuracy (the agent's payload).

    Every primary output must be within the tolerance; `value`, `drop` and `metric` are those of
    the worst primary output, `outputs` keeps each output's figures for the report.
    """
    accuracy = accuracy if isinstance(accuracy, dict) else {}
    result = {**accuracy, "metric": None, "value": None, "reference_value": None, "drop": None, "within_tolerance": False, "output": None}
    rows = _candidates(tolerance, accuracy)
    if not rows:
        result["metric"] = TOLERANCE_FIGURES.get(tolerance.get("metric", AUTO))
        result["reason"] = "no primary output measured the tolerance's metric"
        return result
    verdicts = [_verdict(tolerance, row) for row in rows]
    worst = min(verdicts, key=lambda verdict: (verdict["value"] is not None, verdict["within_tolerance"], -(verdict["drop"] or 0.0)))
    result.update(worst)
    result["within_tolerance"] = all(verdict["within_tolerance"] for verdict in verdicts)
    return result


def _verdict(tolerance: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    verdict = {"metric": row["figure"], "output": row["output"], "value": row["value"], "reference_value": row["reference"], "drop": None,
               "within_tolerance": False}
    value = row["value"]
    if not _finite(value):
        verdict["value"] = None
        verdict["reason"] = row.get("error") or f"{row['figure']} was not measured on output {row['output']}"
        return verdict
    if tolerance.get("metric") == "sqnr":
        verdict["within_tolerance"] = value >= tolerance.get("min_value", DEFAULT_MIN_SQNR_DB) - EPSILON
        return verdict
    if row["figure"] == "sqnr_db":
        # sqnr as an output's own metric has no drop: judge it by the default floor.
        verdict["within_tolerance"] = value >= DEFAULT_MIN_SQNR_DB - EPSILON
        return verdict
    drop = figure_drop(row["figure"], value, row["reference"] if _finite(row["reference"]) else None)
    if drop is None:
        verdict["reason"] = f"{row['figure']} has no FP32 reference value"
        return verdict
    reference = row["reference"] if _finite(row["reference"]) else (METRICS.get(row["figure"]) or METRICS["plugin"]).ideal
    verdict.update(reference_value=reference, drop=drop, within_tolerance=drop <= tolerance.get("max_drop", DEFAULT_TOLERANCE["max_drop"]) + EPSILON)
    return verdict


def quality(accuracy: dict[str, Any]) -> float | None:
    """One higher-is-better number to rank variants by (the Pareto set, the fallback pick)."""
    if not accuracy or accuracy.get("value") is None:
        return None
    if accuracy.get("drop") is not None:
        return -float(accuracy["drop"])
    return float(accuracy["value"])


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
