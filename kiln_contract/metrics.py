"""Accuracy of device outputs against FP32 reference outputs (and labels), per output kind.

numpy only: the agent computes everything here on the device, and the host's search and the
benchmark import the same functions. `evaluate` follows an evaluation plan (see
`kiln_contract.contract.evaluation_plan`) and returns a plain-JSON payload: per output its kind, its
figures, FP32's own figure where one exists (label metrics, plugins), and any error, so that one
bad metric never hides the others.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from kiln_contract import contract

logger = logging.getLogger(__name__)

# Identical outputs have infinite SQNR; a finite cap keeps the value valid JSON and comparable.
SQNR_CAP_DB = 200.0
# A position whose FP32 top-2 margin is this small is a tie: which class wins is numerical noise.
TIE_RTOL = 1e-4
TIE_ATOL = 1e-6
# Probabilities this close to the mask or score threshold fall either way with rounding alone.
THRESHOLD_TOLERANCE = 1e-3
MAX_DETECTIONS = 300
# FP32 softmax rows sum to 1 within about 1e-6 even over thousands of classes; a regression rarely comes this close.
PROBABILITY_SUM_TOLERANCE = 1e-3
PLUGIN_GROUP = "kiln.metrics"


def _as_float64(array) -> np.ndarray:
    return np.asarray(array, dtype=np.float64)


def _check_shapes(output: np.ndarray, reference: np.ndarray) -> None:
    if output.shape != reference.shape:
        raise ValueError(f"shape mismatch: output {output.shape} vs reference {reference.shape}")


# ---------------------------------------------------------------------------------------------
# Figures that apply to any numeric output


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
    # A NaN output stays NaN (not measured): clamped, min(1.0, nan) would read as a perfect 1.0.
    return value if math.isnan(value) else max(-1.0, min(1.0, value))


def sqnr_db(output, reference) -> float:
    """Signal-to-quantization-noise ratio in dB: 10·log10(Σref² / Σ(ref−out)²), the reference
    being the signal. Capped at SQNR_CAP_DB (identical outputs); -SQNR_CAP_DB for a zero signal
    with noise."""
    output, reference = _as_float64(output), _as_float64(reference)
    _check_shapes(output, reference)
    return sqnr_from_energy(float(np.sum(reference * reference)), float(np.sum((reference - output) ** 2)))


def sqnr_from_energy(signal: float, noise: float) -> float:
    """sqnr_db from Σref² and Σ(ref−out)², for figures summed batch by batch (workers/quantize/sensitivity.py)."""
    if noise == 0.0:
        return SQNR_CAP_DB
    if signal == 0.0:
        return -SQNR_CAP_DB
    return max(-SQNR_CAP_DB, min(SQNR_CAP_DB, 10.0 * math.log10(signal / noise)))


def relative_l2(output, reference) -> float:
    """||output − reference|| / ||reference||; 0 for identical arrays, capped at 1e6."""
    output, reference = _as_float64(output), _as_float64(reference)
    _check_shapes(output, reference)
    noise = float(np.linalg.norm((output - reference).ravel()))
    if noise == 0.0:
        return 0.0
    signal = float(np.linalg.norm(reference.ravel()))
    return min(1e6, noise / signal) if signal > 0.0 else 1e6


def max_abs_error(output, reference) -> float:
    """Largest absolute elementwise difference."""
    output, reference = _as_float64(output), _as_float64(reference)
    _check_shapes(output, reference)
    if output.size == 0:
        return 0.0
    return float(np.max(np.abs(output - reference)))


# ---------------------------------------------------------------------------------------------
# Class scores


def _positions(array: np.ndarray, axis: int = -1) -> np.ndarray | None:
    """The array as [positions, classes] with the class axis last, or None when top-k means nothing."""
    if array.ndim < 2 or array.shape[axis] < 2:
        return None
    return np.moveaxis(array, axis, -1).reshape(-1, array.shape[axis])


def tie_mask(reference_rows: np.ndarray) -> np.ndarray:
    """Positions whose FP32 top-2 margin is within numerical noise: any backend may pick either class."""
    if reference_rows.shape[1] < 2:
        return np.zeros(reference_rows.shape[0], dtype=bool)
    top2 = -np.partition(-reference_rows, 1, axis=1)[:, :2]
    margin = top2[:, 0] - top2[:, 1]
    return margin <= TIE_ATOL + TIE_RTOL * np.abs(top2[:, 0])


def top1_agreement(output, reference, axis: int = -1) -> float | None:
    """Share of positions whose top class equals FP32's, ties in FP32 not counted; None when the
    output has no class axis. All-tie outputs agree by definition (1.0)."""
    output, reference = np.asarray(output), np.asarray(reference)
    _check_shapes(output, reference)
    output_rows, reference_rows = _positions(output, axis), _positions(reference, axis)
    if output_rows is None or output_rows.shape[0] == 0:
        return None
    counted = ~tie_mask(reference_rows.astype(np.float64))
    if not counted.any():
        return 1.0
    same = np.argmax(output_rows, axis=1) == np.argmax(reference_rows, axis=1)
    return float(np.mean(same[counted]))


def topk_agreement(output, reference, k: int = 5, axis: int = -1) -> float | None:
    """Mean overlap of the top-k class sets per position, |topk(out) ∩ topk(ref)| / k, with k capped
    at the number of classes; None where top1_agreement is None."""
    output, reference = np.asarray(output), np.asarray(reference)
    _check_shapes(output, reference)
    output_rows, reference_rows = _positions(output, axis), _positions(reference, axis)
    if output_rows is None or output_rows.shape[0] == 0:
        return None
    k = min(k, output_rows.shape[1])
    top_output = np.sort(np.argpartition(-output_rows, k - 1, axis=1)[:, :k], axis=1)
    top_reference = np.sort(np.argpartition(-reference_rows, k - 1, axis=1)[:, :k], axis=1)
    overlaps = [np.intersect1d(out_row, ref_row, assume_unique=True).size for out_row, ref_row in zip(top_output, top_reference)]
    return float(np.mean(overlaps) / k)


# ---------------------------------------------------------------------------------------------
# Probability maps, embeddings


def mask_iou(output, reference, threshold: float = contract.DEFAULT_MASK_THRESHOLD) -> float:
    """IoU of the foreground (value >= threshold) of output and reference over all samples.

    Pixels whose reference lies within THRESHOLD_TOLERANCE of the threshold are left out: they
    fall either way with rounding alone. Two empty foregrounds agree (1.0).
    """
    output, reference = np.asarray(output, np.float64), np.asarray(reference, np.float64)
    _check_shapes(output, reference)
    counted = np.abs(reference - threshold) > THRESHOLD_TOLERANCE
    ours, theirs = (output >= threshold) & counted, (reference >= threshold) & counted
    union = int(np.count_nonzero(ours | theirs))
    if union == 0:
        return 1.0
    return float(np.count_nonzero(ours & theirs) / union)


def vector_cosines(output, reference) -> np.ndarray:
    """Cosine similarity of each vector along the last axis."""
    output, reference = np.asarray(output, np.float64), np.asarray(reference, np.float64)
    _check_shapes(output, reference)
    output = output.reshape(-1, output.shape[-1]) if output.ndim else output.reshape(1, 1)
    reference = reference.reshape(-1, reference.shape[-1]) if reference.ndim else reference.reshape(1, 1)
    dot = np.sum(output * reference, axis=1)
    norms = np.linalg.norm(output, axis=1) * np.linalg.norm(reference, axis=1)
    both_zero = (np.linalg.norm(output, axis=1) == 0) & (np.linalg.norm(reference, axis=1) == 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        cosines = np.where(norms > 0, dot / np.where(norms > 0, norms, 1.0), 0.0)
    return np.clip(np.where(both_zero, 1.0, cosines), -1.0, 1.0)


# ---------------------------------------------------------------------------------------------
# Embeddings, heat maps and distributions over bins: agreement on what users do with them


def neighbour_agreement(output, reference) -> float | None:
    """Share of samples whose nearest other sample by cosine is the one FP32 picks (a retrieval's or a downstream
    nearest-class decision). Samples are the first axis, each flattened; None with fewer than three samples."""
    output, reference = np.asarray(output, np.float64), np.asarray(reference, np.float64)
    _check_shapes(output, reference)
    if output.ndim == 0 or output.shape[0] < 3:
        return None
    return float(np.mean(_nearest_other(output) == _nearest_other(reference)))


def _nearest_other(array: np.ndarray) -> np.ndarray:
    vectors = array.reshape(array.shape[0], -1)
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, -np.inf)
    return np.argmax(similarity, axis=1)


# A region smaller than this share of the map is a speck users' post-processing drops (DB text detection, saliency ROIs).
DEFAULT_MIN_REGION = 0.001
REGION_MATCH_IOU = 0.5
# A heat map's peak agrees when it moved by at most this share of the map's longer side (and never less than a pixel).
PEAK_RADIUS = 0.02


def heat_maps(array) -> np.ndarray:
    """[maps, H, W]: a [N, 1, H, W] or [N, H, W] output (any leading axes) as single-channel maps."""
    array = np.asarray(array, np.float64)
    if array.ndim < 2:
        raise ValueError(f"a heat map needs at least two spatial axes, got shape {list(array.shape)}")
    return array.reshape(-1, array.shape[-2], array.shape[-1])


def connected_regions(foreground: np.ndarray) -> tuple[np.ndarray, int]:
    """(labels, count) of the 4-connected areas of one 2-D boolean map; 0 is background. numpy only: labels spread
    as the smallest index among neighbours until nothing changes (as many steps as the longest region is long)."""
    height, width = foreground.shape
    big = height * width + 1
    labels = np.where(foreground, np.arange(1, height * width + 1).reshape(height, width), big)
    while True:
        spread = labels.copy()
        spread[1:, :] = np.minimum(spread[1:, :], labels[:-1, :])
        spread[:-1, :] = np.minimum(spread[:-1, :], labels[1:, :])
        spread[:, 1:] = np.minimum(spread[:, 1:], labels[:, :-1])
        spread[:, :-1] = np.minimum(spread[:, :-1], labels[:, 1:])
        spread = np.where(foreground, spread, big)
        if np.array_equal(spread, labels):
            break
        labels = spread
    roots = np.unique(labels[foreground])
    relabelled = np.zeros((height, width), dtype=np.int64)
    relabelled[foreground] = np.searchsorted(roots, labels[foreground]) + 1
    return relabelled, len(roots)


def _regions(heat_map: np.ndarray, threshold: float, min_area: int) -> list[np.ndarray]:
    labels, count = connected_regions(heat_map >= threshold)
    areas = np.bincount(labels.reshape(-1), minlength=count + 1)
    return [labels == index for index in range(1, count + 1) if areas[index] >= min_area]


def region_agreement(output, reference, threshold: float = contract.DEFAULT_MASK_THRESHOLD,
                     min_region: float = DEFAULT_MIN_REGION) -> dict[str, float]:
    """Regions (connected areas at `threshold`, specks under `min_region` of the map left out) matched one to one with
    FP32's at IoU >= 0.5, over every map: F1, recall and precision; two maps without regions agree."""
    ours_maps, theirs_maps = heat_maps(output), heat_maps(reference)
    _check_shapes(ours_maps, theirs_maps)
    min_area = max(1, int(round(min_region * ours_maps.shape[1] * ours_maps.shape[2])))
    matched = found = expected = 0
    for ours_map, theirs_map in zip(ours_maps, theirs_maps):
        ours, theirs = _regions(ours_map, threshold, min_area), _regions(theirs_map, threshold, min_area)
        found, expected = found + len(ours), expected + len(theirs)
        taken: set[int] = set()
        for region in theirs:
            best, best_iou = None, REGION_MATCH_IOU
            for index, candidate in enumerate(ours):
                if index in taken:
                    continue
                iou = np.count_nonzero(region & candidate) / max(1, np.count_nonzero(region | candidate))
                if iou >= best_iou:
                    best, best_iou = index, iou
            if best is not None:
                taken.add(best)
                matched += 1
    if found + expected == 0:
        return {"region_f1": 1.0, "region_recall": 1.0, "region_precision": 1.0, "regions": 0}
    return {"region_f1": 2.0 * matched / (found + expected), "region_recall": matched / expected if expected else 1.0,
            "region_precision": matched / found if found else 1.0, "regions": expected}


def heat_map_peak_agreement(output, reference, threshold: float = contract.DEFAULT_MASK_THRESHOLD) -> float | None:
    """Share of maps whose hottest point is within PEAK_RADIUS of FP32's, over the maps where FP32's peak reaches the
    threshold (elsewhere there is no peak to find); None when no map has one."""
    ours_maps, theirs_maps = heat_maps(output), heat_maps(reference)
    _check_shapes(ours_maps, theirs_maps)
    height, width = theirs_maps.shape[1:]
    peaked = theirs_maps.reshape(len(theirs_maps), -1).max(axis=1) >= threshold
    if not peaked.any():
        return None
    radius = max(1.0, PEAK_RADIUS * max(height, width))
    ours = np.array(np.unravel_index(np.argmax(ours_maps[peaked].reshape(int(peaked.sum()), -1), axis=1), (height, width)))
    theirs = np.array(np.unravel_index(np.argmax(theirs_maps[peaked].reshape(int(peaked.sum()), -1), axis=1), (height, width)))
    return float(np.mean(np.hypot(*(ours - theirs)) <= radius))


# Bins on each side of the peak that the decoded value averages over (CREPE's weighted argmax takes four).
DECODE_WINDOW = 4
DECODE_TOLERANCE_BINS = 0.5
# Rows whose FP32 peak is below this share of the highest peak in the data have no clear answer (CREPE's unvoiced frames).
CLEAR_PEAK_SHARE = 0.5


def decode_around_peak(rows: np.ndarray, window: int = DECODE_WINDOW) -> tuple[np.ndarray, np.ndarray]:
    """(peak bin, decoded position in bins) per row: the weighted mean of the bin indices within `window` of the peak."""
    rows = np.asarray(rows, np.float64)
    peaks = np.argmax(rows, axis=1)
    offsets = np.arange(-window, window + 1)
    index = np.clip(peaks[:, None] + offsets[None, :], 0, rows.shape[1] - 1)
    inside = (peaks[:, None] + offsets[None, :] >= 0) & (peaks[:, None] + offsets[None, :] < rows.shape[1])
    weights = np.where(inside, np.maximum(np.take_along_axis(rows, index, axis=1), 0.0), 0.0)
    total = weights.sum(axis=1)
    decoded = np.where(total > 0, (weights * index).sum(axis=1) / np.where(total > 0, total, 1.0), peaks)
    return peaks, decoded


def distribution_agreement(output, reference, window: int = DECODE_WINDOW,
                           tolerance_bins: float = DECODE_TOLERANCE_BINS) -> dict[str, float]:
    """A distribution over the last axis's ordered bins, decoded around its peak, against FP32's, over the rows where FP32
    has a clear peak: the share decoded within `tolerance_bins`, the share whose peak is within a bin, the mean error."""
    output, reference = np.asarray(output, np.float64), np.asarray(reference, np.float64)
    _check_shapes(output, reference)
    ours, theirs = output.reshape(-1, output.shape[-1]), reference.reshape(-1, reference.shape[-1])
    heights = theirs.max(axis=1) - np.median(theirs, axis=1)
    clear = heights >= CLEAR_PEAK_SHARE * heights.max() if heights.size and heights.max() > 0 else np.ones(len(theirs), bool)
    our_peaks, our_values = decode_around_peak(ours[clear], window)
    their_peaks, their_values = decode_around_peak(theirs[clear], window)
    error = np.abs(our_values - their_values)
    return {"decoded_agreement": float(np.mean(error <= tolerance_bins + 1e-9)),
            "peak_agreement": float(np.mean(np.abs(our_peaks - their_peaks) <= 1)),
            "decoded_error_bins": float(np.mean(error)), "rows_judged": int(clear.sum())}


def smooth_peaked_rows(values, *, min_bins: int = 16) -> bool:
    """Whether FP32's rows over the last axis look like a distribution over ordered bins: a clear peak whose neighbouring
    bins carry a good part of its height (a blurred one-hot, as CREPE's pitch bins), unlike independent classes."""
    array = np.asarray(values, np.float64)
    if array.ndim < 2 or array.shape[-1] < min_bins or not np.isfinite(array).all():
        return False
    rows = array.reshape(-1, array.shape[-1])
    rows = rows - np.median(rows, axis=1, keepdims=True)
    heights = rows.max(axis=1)
    clear = heights >= CLEAR_PEAK_SHARE * heights.max() if heights.max() > 0 else np.zeros(len(rows), bool)
    if clear.sum() < 1:
        return False
    rows, heights = rows[clear], heights[clear]
    peaks = np.argmax(rows, axis=1)
    left = rows[np.arange(len(rows)), np.clip(peaks - 1, 0, rows.shape[1] - 1)]
    right = rows[np.arange(len(rows)), np.clip(peaks + 1, 0, rows.shape[1] - 1)]
    return bool(np.median(np.maximum(left, right) / heights) >= 0.3 and np.median(np.minimum(left, right) / heights) >= 0.1)


# ---------------------------------------------------------------------------------------------
# Token masks: an encoder's padding positions do not count


def kept_positions(mask, positions: int) -> np.ndarray:
    """Which token positions an attention mask keeps, flat, one bool per position.

    A 0/1 (or bool) mask keeps its 1s; an additive mask (0 on tokens, a negative bias on padding,
    as some exports take it) keeps its 0s, so an all-zero mask keeps everything. Any shape whose
    values are the output's positions in order fits ([N, T], [N, 1, 1, T]).
    """
    values = np.asarray(mask)
    if values.size != positions:
        raise ValueError(f"the mask has {values.size} values for {positions} token positions")
    values = values.reshape(-1)
    if values.dtype == np.bool_:
        return values.copy()
    values = values.astype(np.float64)
    if np.isin(values, (0.0, 1.0)).all() and (values == 1.0).any():
        return values == 1.0
    if (values <= 0.0).all():
        return values == 0.0
    raise ValueError("the mask is neither 0/1 nor additive (0 on tokens, negative on padding)")


def mean_pooled(array, keep: np.ndarray, tokens: int) -> np.ndarray:
    """The mask-weighted mean of each sequence's token vectors, [sequences, H]: sentence-transformers' mean pooling."""
    array = np.asarray(array, np.float64)
    vectors = array.reshape(-1, tokens, array.shape[-1])
    weights = keep.reshape(-1, tokens, 1).astype(np.float64)
    return (vectors * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)


def token_view(kind: str, output: np.ndarray, reference: np.ndarray, labels: np.ndarray | None, mask
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, dict[str, Any]]:
    """Output and reference as [kept tokens, H] rows, the labels of those tokens (when there is one
    per position), and the figures only the mask gives: the kept count and, for token vectors, the
    cosine of the mean-pooled sentence embeddings.

    Every other figure of the output is then computed on the kept rows alone, so a variant that
    differs from FP32 only on padding matches it exactly. Which figure is the headline is
    contract.KIND_METRICS' decision (the kept tokens' `cosine_p5`).
    """
    positions = int(np.prod(output.shape[:-1]))
    keep = kept_positions(mask, positions)
    figures: dict[str, Any] = {"kept_tokens": int(keep.sum())}
    if kind == "embedding":
        tokens = int(np.asarray(mask).shape[-1])
        cosines = vector_cosines(mean_pooled(output, keep, tokens), mean_pooled(reference, keep, tokens))
        figures.update(sentence_cosine_mean=float(np.mean(cosines)), sentence_cosine_p5=float(np.percentile(cosines, 5)))
    if labels is not None and labels.size == positions:
        labels = labels.reshape(-1)[keep]
    return output.reshape(positions, -1)[keep], reference.reshape(positions, -1)[keep], labels, figures


# ---------------------------------------------------------------------------------------------
# Detection


def _sample_table(array: np.ndarray, layout: str) -> np.ndarray:
    """One sample's detection head as [anchors, fields]."""
    table = np.asarray(array, np.float64)
    while table.ndim > 2 and table.shape[0] == 1:
        table = table[0]
    if table.ndim != 2:
        raise ValueError(f"a detection head is [anchors, fields] per sample; got {list(array.shape)}")
    return table.T if layout == "channels_first" else table


def detection_layout(shape: tuple[int, ...]) -> str:
    """YOLOv8-style heads are [4+C, A] per sample (fields first); YOLOv5/X are [A, 5+C]."""
    dims = [d for d in shape if d != 1] or list(shape)
    return "channels_first" if len(dims) >= 2 and dims[-2] < dims[-1] else "channels_last"


def _grid_decode(table: np.ndarray, grid: dict[str, Any]) -> np.ndarray:
    """Raw YOLOX-style boxes (cell offsets, log sizes) to pixels, as the model's own post-processing does."""
    height, width = grid["input_hw"]
    cells, strides = [], []
    for stride in grid["strides"]:
        rows, cols = height // stride, width // stride
        xs, ys = np.meshgrid(np.arange(cols), np.arange(rows))
        cells.append(np.stack([xs.ravel(), ys.ravel()], axis=1))
        strides.append(np.full(rows * cols, stride))
    cell, stride = np.concatenate(cells), np.concatenate(strides)[:, None]
    if cell.shape[0] != table.shape[0]:
        raise ValueError(f"grid decode expects {cell.shape[0]} anchors, the head has {table.shape[0]}")
    boxes = table.copy()
    boxes[:, :2] = (table[:, :2] + cell) * stride
    boxes[:, 2:4] = np.exp(np.clip(table[:, 2:4], -20, 20)) * stride
    return boxes


def _xyxy(boxes: np.ndarray, box_format: str) -> np.ndarray:
    if box_format == "xyxy":
        return boxes
    cx, cy, w, h = boxes.T
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of xyxy boxes, [len(a), len(b)]."""
    if len(a) == 0 or len(b) == 0:
        return np.zeros((len(a), len(b)))
    left, top = np.maximum(a[:, None, 0], b[None, :, 0]), np.maximum(a[:, None, 1], b[None, :, 1])
    right, bottom = np.minimum(a[:, None, 2], b[None, :, 2]), np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(right - left, 0, None) * np.clip(bottom - top, 0, None)
    area_a = np.clip(a[:, 2] - a[:, 0], 0, None) * np.clip(a[:, 3] - a[:, 1], 0, None)
    area_b = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def _nms(boxes: np.ndarray, scores: np.ndarray, iou: float) -> np.ndarray:
    order = np.argsort(-scores, kind="stable")
    keep = []
    while order.size and len(keep) < MAX_DETECTIONS:
        best, rest = order[0], order[1:]
        keep.append(best)
        order = rest[box_iou(boxes[best : best + 1], boxes[rest])[0] <= iou]
    return np.asarray(keep, dtype=np.int64)


def decode_detections(array: np.ndarray, options: dict[str, Any], *, floor: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(boxes xyxy, scores, classes) of one sample after the score floor and per-class NMS."""
    layout = options.get("layout") or detection_layout(array.shape)
    table = _sample_table(array, layout)
    if options.get("grid"):
        table = _grid_decode(table, options["grid"])
    objectness = options.get("objectness", layout == "channels_last" and table.shape[1] >= 6)
    first_class = 5 if objectness else 4
    if table.shape[1] <= first_class - 1 or table.shape[1] < 5:
        raise ValueError(f"a detection head needs 4 box fields and class scores; got {table.shape[1]} fields")
    class_scores = table[:, first_class:] if table.shape[1] > first_class else table[:, 4:5]
    if objectness:
        class_scores = class_scores * table[:, 4:5]
    classes = np.argmax(class_scores, axis=1)
    scores = class_scores[np.arange(len(classes)), classes]
    keep = scores >= floor
    boxes, scores, classes = _xyxy(table[keep, :4], options.get("box_format", "cxcywh")), scores[keep], classes[keep]
    nms_iou = options.get("nms_iou", contract.DEFAULT_NMS_IOU)
    kept = [index[_nms(boxes[index], scores[index], nms_iou)] for index in (np.flatnonzero(classes == c) for c in np.unique(classes))]
    kept = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)
    return boxes[kept], scores[kept], classes[kept]


def detection_agreement(output, reference, options: dict[str, Any] | None = None) -> dict[str, float]:
    """FP32's detections matched by the device's: recall, precision, F1 and the mean IoU of matched boxes.

    Both sides are decoded, filtered at the score threshold and reduced by per-class NMS. A device
    detection matches an FP32 detection of the same class at IoU >= match_iou (greedy, by FP32
    score). Detections scored within THRESHOLD_TOLERANCE of the threshold on either side neither
    count as missed nor as extra: rounding alone moves them across it.
    """
    options = options or {}
    output, reference = np.asarray(output), np.asarray(reference)
    _check_shapes(output, reference)
    threshold = options.get("threshold", contract.DEFAULT_SCORE_THRESHOLD)
    match_iou = options.get("match_iou", contract.DEFAULT_MATCH_IOU)
    floor = max(0.0, threshold - THRESHOLD_TOLERANCE)
    required = found = counted = correct = 0
    ious: list[float] = []
    for sample_out, sample_ref in zip(output, reference):
        ref_boxes, ref_scores, ref_classes = decode_detections(sample_ref, options, floor=floor)
        out_boxes, out_scores, out_classes = decode_detections(sample_out, options, floor=floor)
        ref_sure = ref_scores >= threshold + THRESHOLD_TOLERANCE
        out_sure = out_scores >= threshold + THRESHOLD_TOLERANCE
        overlaps = box_iou(ref_boxes, out_boxes)
        taken = np.zeros(len(out_boxes), dtype=bool)
        for index in np.argsort(-ref_scores, kind="stable"):
            candidates = np.flatnonzero((out_classes == ref_classes[index]) & ~taken & (overlaps[index] >= match_iou))
            if candidates.size:
                best = candidates[np.argmax(overlaps[index, candidates])]
                taken[best] = True
                ious.append(float(overlaps[index, best]))
                found += int(ref_sure[index])
                correct += int(out_sure[best])
        required += int(ref_sure.sum())
        counted += int(out_sure.sum())
    recall = found / required if required else 1.0
    precision = correct / counted if counted else 1.0
    f1 = 2 * recall * precision / (recall + precision) if recall + precision else 0.0
    return {"detection_f1": f1, "detection_recall": recall, "detection_precision": precision,
            "box_iou": float(np.mean(ious)) if ious else 1.0, "detections": required}


# ---------------------------------------------------------------------------------------------
# Label metrics


def _class_positions(output: np.ndarray, labels: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray] | None:
    rows = _positions(output, axis)
    positions = np.moveaxis(output, axis, -1).shape[:-1]
    if rows is None or not np.issubdtype(labels.dtype, np.integer) or labels.size == 0:
        return None
    if labels.shape != positions:
        squeezed = tuple(d for d in positions if d != 1)
        if tuple(d for d in labels.shape if d != 1) != squeezed:
            return None
    return rows, labels.reshape(-1).astype(np.int64)


def label_accuracy(output, labels, axis: int = -1, k: int = 1) -> float | None:
    """Top-k accuracy against integer labels (negative labels are padding); None when the output
    is not shaped as the labels plus a class axis."""
    output, labels = np.asarray(output), np.asarray(labels)
    fitted = _class_positions(output, labels, axis)
    if fitted is None:
        return None
    rows, flat = fitted
    counted = flat >= 0
    if not counted.any():
        return None
    rows, flat = rows[counted], flat[counted]
    if k == 1:
        return float(np.mean(np.argmax(rows, axis=1) == flat))
    k = min(k, rows.shape[1])
    top = np.argpartition(-rows, k - 1, axis=1)[:, :k]
    return float(np.mean(np.any(top == flat[:, None], axis=1)))


def mean_iou(output, labels, *, kind: str, threshold: float = contract.DEFAULT_MASK_THRESHOLD, axis: int = 1) -> float | None:
    """Mean IoU over classes present in the labels or the prediction, against integer label masks.

    A probability map is thresholded (foreground = class 1); class scores per pixel take the
    argmax over the class axis. None when the labels do not have the map's spatial shape.
    """
    output, labels = np.asarray(output), np.asarray(labels)
    if not np.issubdtype(labels.dtype, np.integer) or labels.ndim < 2:
        return None
    if kind == "probability_map":
        prediction = (output >= threshold).astype(np.int64)
    elif output.ndim >= 3 and output.shape[axis] >= 2:
        prediction = np.argmax(output, axis=axis)
    else:
        return None
    prediction = prediction.reshape(labels.shape[0], -1) if prediction.size == labels.size else None
    if prediction is None:
        return None
    truth = labels.reshape(labels.shape[0], -1)
    valid = truth >= 0
    ious = []
    for cls in np.union1d(np.unique(truth[valid]), np.unique(prediction[valid])):
        ours, theirs = (prediction == cls) & valid, (truth == cls) & valid
        union = np.count_nonzero(ours | theirs)
        if union:
            ious.append(np.count_nonzero(ours & theirs) / union)
    return float(np.mean(ious)) if ious else None


def ctc_greedy_decode(output: np.ndarray, blank: int) -> list[list[int]]:
    """Best path per sample: argmax per position, repeats collapsed, blanks removed."""
    best = np.argmax(output.reshape(output.shape[0], -1, output.shape[-1]), axis=-1)
    sequences = []
    for row in best:
        collapsed = row[np.concatenate([[True], row[1:] != row[:-1]])] if row.size else row
        sequences.append([int(v) for v in collapsed if v != blank])
    return sequences


def edit_distance(a: list[int], b: list[int]) -> int:
    previous = list(range(len(b) + 1))
    for i, item in enumerate(a, 1):
        current = [i]
        for j, other in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (item != other)))
        previous = current
    return previous[-1]


def ctc_scores(output, labels, blank: int) -> dict[str, float] | None:
    """Sequence accuracy and character error rate of greedy CTC decoding against padded label
    sequences ([N, L] integers; negative values and the blank are padding)."""
    output, labels = np.asarray(output), np.asarray(labels)
    if not np.issubdtype(labels.dtype, np.integer) or labels.ndim != 2 or output.ndim < 3 or labels.shape[0] != output.shape[0]:
        return None
    if not 0 <= blank < output.shape[-1]:
        raise ValueError(f"blank index {blank} is outside the {output.shape[-1]} classes")
    decoded = ctc_greedy_decode(output, blank)
    truths = [[int(v) for v in row if v >= 0 and v != blank] for row in labels]
    errors = sum(edit_distance(pred, truth) for pred, truth in zip(decoded, truths))
    characters = sum(len(truth) for truth in truths)
    return {"sequence_accuracy": float(np.mean([pred == truth for pred, truth in zip(decoded, truths)])),
            "cer": errors / characters if characters else float(errors > 0)}


# ---------------------------------------------------------------------------------------------
# Plugins


def load_plugin(name: str):
    """The callable behind entry point `name` in group kiln.metrics, installed next to this agent."""
    from importlib.metadata import entry_points

    found = [point for point in entry_points(group=PLUGIN_GROUP) if point.name == name]
    if not found:
        raise ValueError(f"metric plugin {name!r} is not installed on this agent (entry point group {PLUGIN_GROUP})")
    return found[0].load()


def run_plugin(name: str, output: np.ndarray, reference: np.ndarray, labels: np.ndarray | None, options: dict) -> tuple[float, float]:
    """(device value, FP32 value) of a plugin: `plugin(output, labels, options) -> float`, higher is better."""
    function = load_plugin(name)
    values = []
    for array in (output, reference):
        value = function(array, labels, dict(options))
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) or not math.isfinite(float(value)):
            raise ValueError(f"metric plugin {name!r} returned {value!r}; it must return a finite number")
        values.append(float(value))
    return values[0], values[1]


# ---------------------------------------------------------------------------------------------
# Kinds from values, for outputs nobody described


def rows_sum_to_one(values, axis: int = -1) -> bool:
    """Whether every row along `axis` is non-negative and sums to 1 (within PROBABILITY_SUM_TOLERANCE):
    class probabilities, whichever ops computed them (Softmax, or Exp / ReduceSum / Div)."""
    array = np.asarray(values, np.float64)
    if array.ndim < 2 or array.shape[axis] < 2 or array.size == 0 or not np.isfinite(array).all() or array.min() < 0.0:
        return False
    return bool(np.all(np.abs(array.sum(axis=axis) - 1.0) <= PROBABILITY_SUM_TOLERANCE))


def guess_kind(reference: np.ndarray) -> str:
    """A kind from the values alone (the agent's fallback when the task carries no plan)."""
    reference = np.asarray(reference)
    if np.issubdtype(reference.dtype, np.integer) or reference.dtype == np.bool_:
        return "class_ids"
    if reference.ndim >= 4:
        finite = reference[np.isfinite(reference)]
        return "probability_map" if finite.size and finite.min() >= 0.0 and finite.max() <= 1.0 else "dense"
    if reference.ndim >= 2 and reference.shape[-1] >= 2:
        return "class_scores"
    return "regression"


def default_plan(reference: Mapping[str, np.ndarray]) -> dict[str, Any]:
    kinds = {name: {"kind": guess_kind(array)} for name, array in reference.items()}
    return contract.evaluation_plan(output_kinds=kinds, output_order=list(reference), declared=[], has_labels=False)


# ---------------------------------------------------------------------------------------------
# One output, every output


def _finite_or_none(value):
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def kind_figures(kind: str, output: np.ndarray, reference: np.ndarray, options: dict[str, Any]) -> dict[str, Any]:
    """The figures of one output's kind (contract.KIND_METRICS) plus cosine, SQNR, relative L2 and max error."""
    numeric = not (np.issubdtype(reference.dtype, np.integer) or reference.dtype == np.bool_)
    figures: dict[str, Any] = {"max_abs_error": max_abs_error(output, reference)}
    if numeric or kind != "class_ids":
        figures.update(cosine=cosine_similarity(output, reference), sqnr_db=sqnr_db(output, reference),
                       relative_l2=relative_l2(output, reference))
    axis = int(options.get("axis", -1))
    if kind == "class_scores":
        figures["top1_agreement"] = top1_agreement(output, reference, axis)
        figures["top5_agreement"] = topk_agreement(output, reference, 5, axis)
        rows = _positions(reference, axis)
        figures["ties"] = int(tie_mask(rows.astype(np.float64)).sum()) if rows is not None else 0
    elif kind == "class_ids":
        figures["id_agreement"] = float(np.mean(output == reference)) if output.size else 1.0
    elif kind == "probability_map":
        figures["mask_iou"] = mask_iou(output, reference, options.get("threshold", contract.DEFAULT_MASK_THRESHOLD))
    elif kind == "heat_map":
        threshold = options.get("threshold", contract.DEFAULT_MASK_THRESHOLD)
        figures.update(region_agreement(output, reference, threshold, options.get("min_region", DEFAULT_MIN_REGION)))
        figures["peak_agreement"] = heat_map_peak_agreement(output, reference, threshold)
        figures["mask_iou"] = mask_iou(output, reference, threshold)
    elif kind == "distribution":
        figures.update(distribution_agreement(output, reference, int(options.get("window", DECODE_WINDOW))))
    elif kind == "embedding":
        cosines = vector_cosines(output, reference)
        figures["cosine_mean"] = float(np.mean(cosines))
        figures["cosine_p5"] = float(np.percentile(cosines, 5))
        figures["neighbour_agreement"] = neighbour_agreement(output, reference)
    elif kind == "detection":
        figures.update(detection_agreement(output, reference, options))
    return figures


# Declared figures measured by another kind's metrics.
_DECLARED_KINDS = {"regions": "heat_map", "peak": "heat_map", "decoded": "distribution", "neighbours": "embedding"}


def _label_metric(kind: str, declared: dict[str, Any] | None, output: np.ndarray, reference: np.ndarray, labels: np.ndarray,
                  options: dict[str, Any]) -> tuple[dict[str, float], dict[str, float]] | None:
    """(device figures, FP32 figures) of the label metric that fits this output, or None."""
    axis = int(options.get("axis", -1))
    wanted = declared["kind"] if declared else None
    if wanted in (None, "accuracy", "top5_accuracy") and kind == "class_scores":
        top1 = label_accuracy(output, labels, axis)
        if top1 is not None:
            return ({"top1_accuracy": top1, "top5_accuracy": label_accuracy(output, labels, axis, k=5)},
                    {"top1_accuracy": label_accuracy(reference, labels, axis), "top5_accuracy": label_accuracy(reference, labels, axis, k=5)})
    if wanted in (None, "mean_iou") and kind in ("probability_map", "class_scores", "dense"):
        threshold = (declared or {}).get("threshold", options.get("threshold", contract.DEFAULT_MASK_THRESHOLD))
        channel_axis = 1 if kind != "class_scores" or axis == -1 else axis
        ours = mean_iou(output, labels, kind=kind, threshold=threshold, axis=channel_axis)
        if ours is not None:
            return {"mean_iou": ours}, {"mean_iou": mean_iou(reference, labels, kind=kind, threshold=threshold, axis=channel_axis)}
    if wanted == "ctc":
        ours = ctc_scores(output, labels, declared["blank"])
        if ours is not None:
            return ours, ctc_scores(reference, labels, declared["blank"])
    return None


def evaluate_output(entry: dict[str, Any], output: np.ndarray, reference: np.ndarray, labels: np.ndarray | None,
                    mask: np.ndarray | None = None) -> dict[str, Any]:
    """Figures of one output by its plan entry; each failing metric is recorded, the rest stand.

    An entry whose options name an attention mask input (`"mask"`) is judged on the tokens `mask`
    (that input's values) keeps; without a usable mask, on every position, with the reason in errors.
    """
    kind, options = entry["kind"], dict(entry.get("options") or {})
    declared = entry.get("declared") or []
    for item in declared:
        if item["kind"] in ("mask_iou", "detection", "regions"):
            options.update({key: item[key] for key in ("threshold", "match_iou", "nms_iou") if key in item})
    result: dict[str, Any] = {"kind": kind, "primary": bool(entry.get("primary")), "metrics": {}, "reference": {}, "errors": {},
                              "primary_metric": contract.KIND_METRICS[kind][0]}
    _check_shapes(output, reference)
    if options.get("mask"):
        try:
            if mask is None:
                raise ValueError(f"the evaluation has no input {options['mask']!r} to read the attention mask from")
            output, reference, labels, token_figures = token_view(kind, output, reference, labels, mask)
            result["metrics"].update(token_figures)
        except ValueError as error:
            result["errors"]["mask"] = f"{error}; padding positions counted"
    try:
        result["metrics"].update(kind_figures(kind, output, reference, options))
    except Exception as error:  # one kind's metric failing must not hide the others
        result["errors"][contract.KIND_METRICS[kind][0]] = f"{type(error).__name__}: {error}"
    for item in declared:
        figure = f"plugin:{item['plugin']}" if item["kind"] == "plugin" else contract.declared_figure(item)
        try:
            if item["kind"] == "plugin":
                value, reference_value = run_plugin(item["plugin"], output, reference, labels, {k: v for k, v in item.items() if k not in ("output", "kind")})
                result["metrics"][figure] = value
                result["reference"][figure] = reference_value
            elif item["kind"] in contract.LABEL_DECLARATIONS:
                if labels is None:
                    raise ValueError("the validation set has no labels")
                measured = _label_metric(kind, item, output, reference, labels, options)
                if measured is None:
                    raise ValueError(f"labels of shape {list(labels.shape)} fit no {item['kind']} metric of this {kind} output "
                                     f"of shape {list(output.shape)}")
                result["metrics"].update(measured[0])
                result["reference"].update(measured[1])
            elif item["kind"] == "cosine" and "cosine_p5" not in result["metrics"]:
                cosines = vector_cosines(output, reference)
                result["metrics"].update(cosine_mean=float(np.mean(cosines)), cosine_p5=float(np.percentile(cosines, 5)))
            elif item["kind"] in ("top1_agreement", "top5_agreement") and "top1_agreement" not in result["metrics"]:
                result["metrics"].update(top1_agreement=top1_agreement(output, reference, int(options.get("axis", -1))),
                                         top5_agreement=topk_agreement(output, reference, 5, int(options.get("axis", -1))))
            elif item["kind"] == "sentence_cosine" and "sentence_cosine_p5" not in result["metrics"]:
                raise ValueError("sentence_cosine needs token vectors [N, T, H] and the attention mask input named in the plan")
            elif item["kind"] == "id_agreement" and "id_agreement" not in result["metrics"]:
                result["metrics"]["id_agreement"] = float(np.mean(np.asarray(output) == np.asarray(reference)))
            elif item["kind"] == "mask_iou":
                result["metrics"]["mask_iou"] = mask_iou(output, reference, options.get("threshold", contract.DEFAULT_MASK_THRESHOLD))
            elif item["kind"] == "detection" and kind != "detection":
                result["metrics"].update(detection_agreement(output, reference, options))
            elif item["kind"] in _DECLARED_KINDS and contract.declared_figure(item) not in result["metrics"]:
                # Another kind's figure declared for this output (a recipe's or a user's choice): measured as that kind does.
                result["metrics"].update(kind_figures(_DECLARED_KINDS[item["kind"]], output, reference, {**options, **item}))
        except Exception as error:
            logger.warning("metric %s on %s failed: %s", item["kind"], entry["name"], error)
            result["errors"][figure] = f"{type(error).__name__}: {error}"
        if item["primary"]:
            result["primary_metric"] = figure
    if labels is not None and not any(item["kind"] in contract.LABEL_DECLARATIONS for item in declared) and entry.get("label_auto"):
        measured = _label_metric(kind, None, output, reference, labels, options)
        if measured is not None:
            result["metrics"].update(measured[0])
            result["reference"].update(measured[1])
            if not entry.get("declared_primary"):
                result["primary_metric"] = next(iter(measured[0]))
    result["metrics"] = {key: _finite_or_none(value) for key, value in result["metrics"].items()}
    result["reference"] = {key: _finite_or_none(value) for key, value in result["reference"].items()}
    return result


def evaluate(
    outputs: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    plan: dict[str, Any] | None = None,
    labels: np.ndarray | None = None,
    inputs: Mapping[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """Compare every reference output with the device's output of the same name, by the plan.

    `inputs` are the feeds the outputs came from (sample for sample); an output whose plan entry
    names an attention mask input is judged on the tokens that input keeps.

    Returns `{"samples", "outputs": {name: {"kind", "primary", "primary_metric", "metrics",
    "reference", "errors"}}, "labels"}` plus, for a quick look, the primary outputs' worst cosine,
    SQNR, relative L2 and top-1/top-5 agreement, and the label accuracy (FP32's as
    `reference_accuracy`) at the top level.
    """
    missing = [name for name in reference if name not in outputs]
    if missing:
        raise ValueError(f"device outputs lack reference outputs: {', '.join(missing)}")
    if not reference:
        raise ValueError("the reference has no outputs")
    plan = plan or default_plan(reference)
    entries = [entry for entry in plan["outputs"] if entry["name"] in reference]
    planned = {entry["name"] for entry in entries}
    for name in reference:
        if name not in planned:
            entries.append({"name": name, "kind": guess_kind(reference[name]), "options": {}, "primary": False, "declared": []})
    labels = np.asarray(labels) if labels is not None else None
    label_output = _label_output(entries, reference, labels) if labels is not None else None
    per_output = {}
    for entry in entries:
        name = entry["name"]
        entry = {**entry, "label_auto": name == label_output, "declared_primary": plan.get("declared_primary", False)}
        ours, theirs = _joined_head(entry, outputs, reference)
        mask_input = (entry.get("options") or {}).get("mask")
        mask = np.asarray(inputs[mask_input]) if inputs is not None and mask_input in inputs else None
        per_output[name] = evaluate_output(entry, ours, theirs, labels, mask)
    primaries = [result for result in per_output.values() if result["primary"]] or list(per_output.values())
    first = np.asarray(next(iter(reference.values())))
    summary = {
        "samples": int(first.shape[0]) if first.ndim else 1,
        "outputs": per_output,
        "labels": None if labels is None else {"output": label_output, "shape": list(labels.shape)},
    }
    # The flat keys of earlier releases, for scripts that read them: label accuracy on the labeled output.
    labeled = per_output.get(label_output) if label_output else None
    summary["accuracy"] = labeled["metrics"].get("top1_accuracy") if labeled else None
    summary["reference_accuracy"] = labeled["reference"].get("top1_accuracy") if labeled else None
    for figure, pick in (("cosine", min), ("sqnr_db", min), ("relative_l2", max), ("max_abs_error", max), ("top1_agreement", min),
                         ("top5_agreement", min)):
        values = [result["metrics"].get(figure) for result in primaries if result["metrics"].get(figure) is not None]
        summary[figure] = pick(values) if values else None
    declared_labels = any(item["kind"] in contract.LABEL_DECLARATIONS for entry in entries for item in entry.get("declared") or [])
    if labels is not None and label_output is None and not declared_labels:
        summary["labels"]["error"] = f"labels of shape {list(labels.shape)} fit no metric of any output"
        for result in primaries:
            result["errors"]["labels"] = summary["labels"]["error"]
    return summary


def _joined_head(entry: dict[str, Any], outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """An output's arrays; for a detection head split in two outputs, boxes and scores joined as [N, A, 4+C]."""
    name, options = entry["name"], entry.get("options") or {}
    partner = options.get("boxes") or options.get("scores")
    if entry["kind"] != "detection" or partner not in reference or partner not in outputs:
        return np.asarray(outputs[name]), np.asarray(reference[name])
    order = [partner, name] if options.get("boxes") else [name, partner]
    return (np.concatenate([np.asarray(outputs[item], np.float64) for item in order], axis=-1),
            np.concatenate([np.asarray(reference[item], np.float64) for item in order], axis=-1))


def _label_output(entries: list[dict[str, Any]], reference: Mapping[str, np.ndarray], labels: np.ndarray) -> str | None:
    """The output the labels are scored against when no label metric is declared: the first primary that fits, then any."""
    ordered = [entry for entry in entries if entry.get("primary")] + [entry for entry in entries if not entry.get("primary")]
    for entry in ordered:
        array = np.asarray(reference[entry["name"]])
        if _label_metric(entry["kind"], None, array, array, labels, dict(entry.get("options") or {})) is not None:
            return entry["name"]
    return None
