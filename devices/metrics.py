"""Accuracy of device outputs against FP32 reference outputs (and labels). numpy only: the
server-side workers import this module too."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

# Identical outputs have infinite SQNR; a finite cap keeps the value valid JSON and comparable.
SQNR_CAP_DB = 200.0


def _as_float64(array) -> np.ndarray:
    return np.asarray(array, dtype=np.float64)


def _check_shapes(output: np.ndarray, reference: np.ndarray) -> None:
    if output.shape != reference.shape:
        raise ValueError(f"shape mismatch: output {output.shape} vs reference {reference.shape}")


def cosine_similarity(output, reference) -> float:
    """Cosine of the angle between the two arrays, flattened. Two all-zero arrays give 1.0;
    exactly one all-zero array gives 0.0."""
    output, reference = _as_float64(output).ravel(), _as_float64(reference).ravel()
    _check_shapes(output, reference)
    norm_output, norm_reference = np.linalg.norm(output), np.linalg.norm(reference)
    if norm_output == 0.0 and norm_reference == 0.0:
        return 1.0
    if norm_output == 0.0 or norm_reference == 0.0:
        return 0.0
    value = float(np.dot(output, reference) / (norm_output * norm_reference))
    return max(-1.0, min(1.0, value))


def sqnr_db(output, reference) -> float:
    """Signal-to-quantization-noise ratio in dB: 10·log10(Σref² / Σ(ref−out)²), the reference
    being the signal. Capped at SQNR_CAP_DB (identical outputs); -SQNR_CAP_DB for a zero signal
    with noise."""
    output, reference = _as_float64(output), _as_float64(reference)
    _check_shapes(output, reference)
    signal = float(np.sum(reference * reference))
    noise = float(np.sum((reference - output) ** 2))
    if noise == 0.0:
        return SQNR_CAP_DB
    if signal == 0.0:
        return -SQNR_CAP_DB
    return max(-SQNR_CAP_DB, min(SQNR_CAP_DB, 10.0 * math.log10(signal / noise)))


def max_abs_error(output, reference) -> float:
    """Largest absolute elementwise difference."""
    output, reference = _as_float64(output), _as_float64(reference)
    _check_shapes(output, reference)
    if output.size == 0:
        return 0.0
    return float(np.max(np.abs(output - reference)))


def _rows(array: np.ndarray) -> np.ndarray | None:
    """The array as [rows, classes] over its last axis, or None when top-k means nothing."""
    if array.ndim < 2 or array.shape[-1] < 2:
        return None
    return array.reshape(-1, array.shape[-1])


def top1_agreement(output, reference) -> float | None:
    """Fraction of rows (last axis = classes) whose argmax is the same; None for outputs with
    fewer than 2 dims or fewer than 2 classes."""
    output, reference = np.asarray(output), np.asarray(reference)
    _check_shapes(output, reference)
    output_rows, reference_rows = _rows(output), _rows(reference)
    if output_rows is None or output_rows.shape[0] == 0:
        return None
    return float(np.mean(np.argmax(output_rows, axis=1) == np.argmax(reference_rows, axis=1)))


def topk_agreement(output, reference, k: int = 5) -> float | None:
    """Mean overlap of the top-k class sets per row, |topk(out) ∩ topk(ref)| / k, with k capped
    at the number of classes; None where top1_agreement is None."""
    output, reference = np.asarray(output), np.asarray(reference)
    _check_shapes(output, reference)
    output_rows, reference_rows = _rows(output), _rows(reference)
    if output_rows is None or output_rows.shape[0] == 0:
        return None
    k = min(k, output_rows.shape[1])
    top_output = np.argpartition(-output_rows, k - 1, axis=1)[:, :k]
    top_reference = np.argpartition(-reference_rows, k - 1, axis=1)[:, :k]
    overlaps = [
        len(set(out_row.tolist()) & set(ref_row.tolist()))
        for out_row, ref_row in zip(top_output, top_reference)
    ]
    return float(np.mean(overlaps) / k)


def label_accuracy(output, labels) -> float | None:
    """Fraction of argmax predictions over the last axis equal to `labels`; None when the output
    is not shaped as labels plus a class axis."""
    output, labels = np.asarray(output), np.asarray(labels)
    if not _predicts(output, labels):
        return None
    predictions = np.argmax(output, axis=-1)
    return float(np.mean(predictions == labels.astype(np.int64)))


def _predicts(output: np.ndarray, labels: np.ndarray) -> bool:
    return (
        np.issubdtype(labels.dtype, np.integer)
        and output.ndim == labels.ndim + 1
        and output.shape[:-1] == labels.shape
        and output.shape[-1] >= 2
        and labels.size > 0
    )


def _worst(values, pick):
    present = [value for value in values if value is not None]
    return pick(present) if present else None


def compare_outputs(
    outputs: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    labels: np.ndarray | None = None,
) -> dict:
    """Compare every reference output with the device's output of the same name.

    The top-level values are the worst over outputs (lowest cosine, SQNR and agreement, highest
    error); `outputs` holds the per-output breakdown. Labels are scored against the first output
    (in reference order) shaped as labels plus a class axis.
    """
    missing = [name for name in reference if name not in outputs]
    if missing:
        raise ValueError(f"device outputs lack reference outputs: {', '.join(missing)}")
    if not reference:
        raise ValueError("the reference has no outputs")
    per_output = {}
    for name, reference_array in reference.items():
        reference_array = np.asarray(reference_array)
        output_array = np.asarray(outputs[name])
        _check_shapes(output_array, reference_array)
        per_output[name] = {
            "cosine": cosine_similarity(output_array, reference_array),
            "sqnr_db": sqnr_db(output_array, reference_array),
            "max_abs_error": max_abs_error(output_array, reference_array),
            "top1_agreement": top1_agreement(output_array, reference_array),
            "top5_agreement": topk_agreement(output_array, reference_array, 5),
        }
    accuracy = reference_accuracy = None
    labeled_output = None
    if labels is not None:
        labels = np.asarray(labels)
        for name, reference_array in reference.items():
            if _predicts(np.asarray(reference_array), labels):
                labeled_output = name
                accuracy = label_accuracy(outputs[name], labels)
                reference_accuracy = label_accuracy(reference_array, labels)
                break
    rows = list(per_output.values())
    return {
        "cosine": _worst([row["cosine"] for row in rows], min),
        "sqnr_db": _worst([row["sqnr_db"] for row in rows], min),
        "max_abs_error": _worst([row["max_abs_error"] for row in rows], max),
        "top1_agreement": _worst([row["top1_agreement"] for row in rows], min),
        "top5_agreement": _worst([row["top5_agreement"] for row in rows], min),
        "accuracy": accuracy,
        "reference_accuracy": reference_accuracy,
        "labeled_output": labeled_output,
        "samples": int(np.asarray(next(iter(reference.values()))).shape[0])
        if np.asarray(next(iter(reference.values()))).ndim
        else 1,
        "outputs": per_output,
    }
