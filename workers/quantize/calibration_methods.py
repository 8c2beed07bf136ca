"""Activation-range estimation for static INT8: MinMax, Percentile, Entropy and a per-tensor MSE choice.

Ranges are estimated from histograms that are filled batch by batch, so memory is bounded by one
batch of activations plus a fixed-size histogram per tensor, whatever the size of the dataset:

- pass 1 streams the calibration set once to find each tensor's min and max (all MinMax needs);
- pass 2 streams it again into a histogram of `HISTOGRAM_BINS` bins over [-absmax, absmax].

The range rules are pure functions of a `Histogram`, so they can be tested on known data without
a model. `mse` is the error-minimising choice: per tensor it evaluates the MinMax, Percentile and
Entropy ranges and a grid of clipped ranges, and keeps the one whose expected quantization error
(clipping error outside the range, rounding error step²/12 inside it) is lowest, which is the same
as the highest SQNR for that tensor.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import numpy as np
import onnx

from workers.datasets import InvalidDataset, batch_rows, dataset_samples, iter_batches
from workers.inspect import PASS_THROUGH
from workers.quantize.streaming import ActivationStream, CalibrationError, check_finite_inputs, expose_tensors

METHODS = ("minmax", "percentile", "entropy", "mse")
# Tail estimates (percentile, entropy, the MSE search) need enough values in the tails to mean
# anything; MinMax only needs the extremes to be representative.
MIN_SAMPLES = {"minmax": 8, "percentile": 16, "entropy": 16, "mse": 16, "distribution": 16}
HISTOGRAM_BINS = 4096
_ADD_CHUNK = 1 << 20
DEFAULT_PERCENTILE = 99.999
UINT8_LEVELS = 256
# The MSE search tries ranges shrunk from MinMax by these factors, besides the named methods.
_CLIP_FACTORS = np.geomspace(1.0, 0.02, 48)
# The rules that clip a tensor's tails by design. On what the user reads (the model's outputs) a clipped tail is a
# wrong answer for exactly the rare values that matter: a detector's few confident objectness logits, the winning
# class score, a far box coordinate. Outputs keep their observed range under these rules (`output_tensors`); `mse`
# weighs clipping against rounding per tensor and keeps its choice.
TAIL_CLIPPING = ("entropy", "percentile")
# Operators whose outputs hold their inputs' values, only rearranged, selected or joined: a tensor that reaches a graph
# output through them is, value for value, part of that output.
_VALUE_PRESERVING = PASS_THROUGH | {"Concat", "Split", "Tile"}


@dataclass
class Histogram:
    """Counts of one tensor's values in `len(counts)` equal bins over [-absmax, absmax]."""

    counts: np.ndarray
    absmax: float
    minimum: float
    maximum: float

    @property
    def edges(self) -> np.ndarray:
        return np.linspace(-self.absmax, self.absmax, len(self.counts) + 1)

    @property
    def centers(self) -> np.ndarray:
        edges = self.edges
        return (edges[:-1] + edges[1:]) / 2

    @classmethod
    def from_values(cls, values: np.ndarray, bins: int = HISTOGRAM_BINS) -> Histogram:
        """A histogram of an in-memory array (tests, and small tensors)."""
        values = np.asarray(values, dtype=np.float64).ravel()
        histogram = cls.empty(float(values.min()), float(values.max()), bins)
        histogram.add(values)
        return histogram

    @classmethod
    def empty(cls, minimum: float, maximum: float, bins: int = HISTOGRAM_BINS) -> Histogram:
        absmax = max(abs(minimum), abs(maximum))
        return cls(np.zeros(bins, dtype=np.int64), absmax, minimum, maximum)

    def add(self, values: np.ndarray) -> None:
        values = np.asarray(values).ravel()
        if self.absmax == 0.0 or values.size == 0:
            self.counts[len(self.counts) // 2] += values.size
            return
        bins = len(self.counts)
        # A chunk at a time: the float64 and index copies of a whole large activation would double its memory.
        for start in range(0, values.size, _ADD_CHUNK):
            chunk = values[start:start + _ADD_CHUNK]
            index = ((chunk.astype(np.float64) + self.absmax) * (bins / (2 * self.absmax))).astype(np.int64)
            np.clip(index, 0, bins - 1, out=index)
            self.counts += np.bincount(index, minlength=bins)


# ---------------------------------------------------------------------------------------------
# Range rules: pure functions of a histogram. Every range contains zero (zero must be exact).


def minmax_range(histogram: Histogram) -> tuple[float, float]:
    """The observed extremes."""
    return min(histogram.minimum, 0.0), max(histogram.maximum, 0.0)


def percentile_range(histogram: Histogram, percentile: float = DEFAULT_PERCENTILE) -> tuple[float, float]:
    """Clip both tails at the given percentile of the values (one-sided for non-negative tensors)."""
    if not 50.0 < percentile <= 100.0:
        raise ValueError(f"percentile must be in (50, 100], got {percentile}")
    tail = 1.0 - percentile / 100.0
    low = _quantile(histogram, tail) if histogram.minimum < 0 else 0.0
    high = _quantile(histogram, 1.0 - tail) if histogram.maximum > 0 else 0.0
    return _contain_zero(max(low, histogram.minimum), min(high, histogram.maximum))


def entropy_range(histogram: Histogram, *, step: int = 16) -> tuple[float, float]:
    """The clip threshold whose quantized distribution has the least KL divergence from the data.

    TensorRT's procedure on |x| (symmetric, 128 levels a side) or, for a tensor with no negative
    values, on x itself with 255 levels.
    """
    half = len(histogram.counts) // 2
    positive = histogram.counts[half:].astype(np.float64)
    non_negative = histogram.minimum >= 0
    magnitudes = positive if non_negative else positive + histogram.counts[:half][::-1]
    target_bins = UINT8_LEVELS - 1 if non_negative else UINT8_LEVELS // 2
    if magnitudes.sum() == 0 or histogram.absmax == 0.0:
        return minmax_range(histogram)
    bin_width = histogram.absmax / half
    best_threshold, best_divergence = len(magnitudes), math.inf
    for stop in range(target_bins, len(magnitudes) + 1, step):
        divergence = _clipped_kl(magnitudes, stop, target_bins)
        if divergence < best_divergence:
            best_threshold, best_divergence = stop, divergence
    threshold = best_threshold * bin_width
    if non_negative:
        return 0.0, min(threshold, histogram.maximum)
    return _contain_zero(max(-threshold, histogram.minimum), min(threshold, histogram.maximum))


def expected_mse(histogram: Histogram, low: float, high: float, levels: int = UINT8_LEVELS) -> float:
    """Mean squared error of quantizing the histogram's values to `levels` steps over [low, high]."""
    centers, counts = histogram.centers, histogram.counts.astype(np.float64)
    total = counts.sum()
    if total == 0:
        return 0.0
    step = (high - low) / (levels - 1)
    error = np.where(
        centers < low, (low - centers) ** 2, np.where(centers > high, (centers - high) ** 2, step * step / 12.0)
    )
    return float(np.dot(counts, error) / total)


def mse_range(histogram: Histogram, levels: int = UINT8_LEVELS) -> tuple[float, float, str]:
    """The candidate range with the least expected quantization error, and which rule produced it."""
    low, high = minmax_range(histogram)
    candidates: list[tuple[str, tuple[float, float]]] = [
        ("minmax", (low, high)),
        ("percentile-99.9", percentile_range(histogram, 99.9)),
        ("percentile-99.99", percentile_range(histogram, 99.99)),
        ("percentile-99.999", percentile_range(histogram, 99.999)),
        ("entropy", entropy_range(histogram)),
    ]
    candidates += [(f"clip-{factor:.3f}", (low * factor, high * factor)) for factor in _CLIP_FACTORS[1:]]
    scored = [(expected_mse(histogram, lo, hi, levels), index, label, (lo, hi))
              for index, (label, (lo, hi)) in enumerate(candidates)]
    _, _, label, (lo, hi) = min(scored)
    return float(lo), float(hi), label


def range_for(histogram: Histogram, method: str, *, percentile: float = DEFAULT_PERCENTILE) -> tuple[float, float, str]:
    """(low, high, rule) for one tensor under `method`."""
    if method == "minmax":
        return (*minmax_range(histogram), "minmax")
    if method == "percentile":
        return (*percentile_range(histogram, percentile), f"percentile-{percentile:g}")
    if method == "entropy":
        return (*entropy_range(histogram), "entropy")
    if method == "mse":
        return mse_range(histogram)
    raise ValueError(f"unknown calibration method {method!r}; choose one of {', '.join(METHODS)}")


def _quantile(histogram: Histogram, fraction: float) -> float:
    counts = histogram.counts
    cumulative = np.cumsum(counts)
    target = fraction * cumulative[-1]
    index = int(np.searchsorted(cumulative, target, side="left"))
    index = min(index, len(counts) - 1)
    edges = histogram.edges
    # The lower tail is clipped at a bin's lower edge and the upper tail at its upper edge, so
    # the range never cuts into the bin holding the quantile.
    return float(edges[index] if fraction < 0.5 else edges[index + 1])


def _contain_zero(low: float, high: float) -> tuple[float, float]:
    return min(low, 0.0), max(high, 0.0)


def _clipped_kl(magnitudes: np.ndarray, stop: int, target_bins: int) -> float:
    reference = magnitudes[:stop].copy()
    reference[stop - 1] += magnitudes[stop:].sum()
    source = magnitudes[:stop]
    starts = np.linspace(0, stop, target_bins + 1).astype(np.int64)[:-1]
    lengths = np.diff(np.append(starts, stop))
    occupied = (source > 0).astype(np.float64)
    sums = np.add.reduceat(source, starts)
    filled = np.add.reduceat(occupied, starts)
    means = np.divide(sums, filled, out=np.zeros_like(sums), where=filled > 0)
    # Each quantized level spreads its mass over the source bins that held any, as TensorRT does.
    candidate = np.repeat(means, lengths) * occupied
    reference_sum, candidate_sum = reference.sum(), candidate.sum()
    if candidate_sum == 0:
        return math.inf
    p = reference / reference_sum
    q = candidate / candidate_sum
    mask = p > 0
    # Mass the quantized distribution cannot represent is smoothed rather than made infinite.
    q = np.where(q == 0, 1e-10, q)
    return float(np.sum(p[mask] * np.log(p[mask] / q[mask])))


# ---------------------------------------------------------------------------------------------
# Streaming collection over a model and an .npz


@dataclass
class CalibrationResult:
    """Ranges per tensor name and how they were chosen."""

    method: str
    ranges: dict[str, tuple[float, float]]
    rules: dict[str, str] = field(default_factory=dict)
    samples: int = 0
    # How the streamed passes were fed within the memory budget (streaming.ActivationStream.plan).
    streaming: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        chosen: dict[str, int] = {}
        for rule in self.rules.values():
            family = rule.split("-")[0]
            chosen[family] = chosen.get(family, 0) + 1
        return {"method": self.method, "tensors": len(self.ranges), "samples": self.samples, "rules": chosen,
                "streaming": self.streaming}


def check_sample_count(samples: int, method: str) -> None:
    """Raise CalibrationError when `samples` is too few for `method`."""
    needed = MIN_SAMPLES.get(method, MIN_SAMPLES["minmax"])
    if samples < needed:
        raise CalibrationError(
            f"calibration set has {samples} samples; the {method} calibration method needs at least "
            f"{needed} to estimate activation ranges (add samples or use minmax, which needs {MIN_SAMPLES['minmax']})"
        )


def calibrate(
    model_path: str | Path,
    calibration_path: str | Path,
    *,
    method: str = "mse",
    max_samples: int | None = None,
    batch_size: int = 16,
    percentile: float = DEFAULT_PERCENTILE,
    tensor_names: list[str] | None = None,
    bins: int = HISTOGRAM_BINS,
) -> CalibrationResult:
    """Estimate an INT8 range for every float activation of the model (or `tensor_names`)."""
    if method not in METHODS:
        raise ValueError(f"unknown calibration method {method!r}; choose one of {', '.join(METHODS)}")
    try:
        available = dataset_samples(calibration_path)
    except InvalidDataset as error:
        raise CalibrationError(f"calibration dataset unusable: {error}") from error
    samples = min(available, max_samples) if max_samples else available
    check_sample_count(samples, method)
    if tensor_names is None:
        tensor_names = float_activation_names(onnx.load(str(model_path), load_external_data=False))
    with ActivationStream(model_path, tensor_names, batch_size=batch_size, what=f"{method} calibration") as stream:
        stats = stream.reduce(calibration_path, limit=samples)
        served = stream.samples_served
        if method == "minmax":
            ranges = {name: _contain_zero(float(item.minimum), float(item.maximum)) for name, item in stats.items()}
            return CalibrationResult(method, ranges, {name: "minmax" for name in ranges}, served, dict(stream.plan))
        histograms = {name: Histogram.empty(float(item.minimum), float(item.maximum), bins) for name, item in stats.items()}
        for _group, batches in stream.groups(calibration_path, limit=samples):
            for _rows, activations in batches:
                for name, value in activations.items():
                    histograms[name].add(value)
        plan = dict(stream.plan)
    kept_whole = output_tensors(onnx.load(str(model_path), load_external_data=False)) if method in TAIL_CLIPPING else set()
    ranges, rules = {}, {}
    for name, histogram in histograms.items():
        if name in kept_whole:
            low, high, rule = *minmax_range(histogram), "output-minmax"
        else:
            low, high, rule = range_for(histogram, method, percentile=percentile)
        ranges[name], rules[name] = (low, high), rule
    return CalibrationResult(method, ranges, rules, served, plan)


def output_tensors(model: onnx.ModelProto) -> set[str]:
    """The graph's outputs and every tensor that reaches one through value-preserving operators only."""
    producers = {output: node for node in model.graph.node for output in node.output if output}
    found: set[str] = set()
    pending = [value.name for value in model.graph.output]
    while pending:
        name = pending.pop()
        if name in found:
            continue
        found.add(name)
        node = producers.get(name)
        if node is None or node.op_type not in _VALUE_PRESERVING:
            continue
        pending.extend(node.input if node.op_type == "Concat" else node.input[:1])
    return found


def write_ort_calibration_cache(result: CalibrationResult, path: str | Path) -> Path:
    """Write ranges as onnxruntime's calibration cache, which `quantize_static` then uses as is."""
    from onnxruntime.quantization.calibrate import (
        CalibrationMethod,
        TensorData,
        TensorsData,
        save_tensors_data,
    )

    data = {
        name: TensorData(lowest=np.float32(low), highest=np.float32(high))
        for name, (low, high) in result.ranges.items()
    }
    # The cache is checked against quantize_static's calibrate_method; MinMax is what ranges-only data is.
    save_tensors_data(TensorsData(CalibrationMethod.MinMax, data), path)
    return Path(path)


def activation_absmax(model_path: str | Path, calibration_path: str | Path, *, max_samples: int = 32,
                      batch_size: int = 16) -> dict[str, float]:
    """Largest |value| of every float activation over (part of) the calibration set."""
    samples = min(dataset_samples(calibration_path), max_samples)
    names = float_activation_names(onnx.load(str(model_path), load_external_data=False))
    with ActivationStream(model_path, names, batch_size=batch_size, what="the fp16 range check") as stream:
        stats = stream.reduce(calibration_path, limit=samples)
    return {name: max(abs(float(item.minimum)), abs(float(item.maximum))) for name, item in stats.items()}


class ActivationTap:
    """Runs a model with its float intermediate tensors exposed as outputs, one batch at a time."""

    def __init__(self, model_path: str | Path, *, tensor_names: list[str] | None = None, threads: int = 1):
        self.model_path = Path(model_path)
        self.tensor_names = tensor_names
        self.threads = threads
        self._scratch: tempfile.TemporaryDirectory | None = None
        self.session = None

    def __enter__(self) -> Self:
        import onnxruntime as ort

        from workers.convert import save_model

        model = onnx.load(str(self.model_path))
        names = self.tensor_names if self.tensor_names is not None else float_activation_names(model)
        expose_tensors(model, names)
        self._scratch = tempfile.TemporaryDirectory(prefix="kiln-tap-")
        augmented = Path(self._scratch.name) / "augmented.onnx"
        save_model(model, augmented)
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        # Fusions would remove the very intermediate tensors being observed.
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        self.session = ort.InferenceSession(str(augmented), options, providers=["CPUExecutionProvider"])
        self.input_names = [value.name for value in self.session.get_inputs()]
        self.names = list(names)
        graph_inputs = set(self.input_names)
        self._output_names = [name for name in self.names if name not in graph_inputs]
        first = self.session.get_inputs()[0].shape
        self.static_batch = first[0] if first and isinstance(first[0], int) and first[0] > 0 else None
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.session = None
        if self._scratch is not None:
            self._scratch.cleanup()

    def stream(self, calibration_path: str | Path, *, batch_size: int, limit: int) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        """Yield (samples in batch, {tensor name: value}) for each batch, checking values are finite."""
        if self.static_batch:
            batch_size = self.static_batch
            limit -= limit % batch_size
            if limit == 0:
                raise CalibrationError(f"the model takes batches of {batch_size}; the calibration set is smaller")
        served = 0
        try:
            batches = iter_batches(calibration_path, input_names=self.input_names, batch_size=batch_size, limit=limit)
            for batch in batches:
                check_finite_inputs(batch, served)
                outputs = dict(zip(self._output_names, self.session.run(self._output_names, batch)))
                activations = {name: batch[name] if name in batch else outputs[name] for name in self.names}
                for name, value in activations.items():
                    if value.dtype.kind == "f" and not np.isfinite(value).all():
                        raise CalibrationError(
                            f"the model produces NaN or Inf at tensor {name!r} on calibration samples "
                            f"{served}..{served + batch_rows(batch) - 1}; the FP32 model itself "
                            "overflows on this data"
                        )
                served += batch_rows(batch)
                yield batch_rows(batch), activations
        except InvalidDataset as error:
            raise CalibrationError(f"calibration dataset unusable: {error}") from error


def float_activation_names(model: onnx.ModelProto) -> list[str]:
    """Graph inputs and node outputs of float type (after shape inference), in graph order."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    types = {value.name: value.type.tensor_type.elem_type
             for value in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    initializers = {tensor.name for tensor in model.graph.initializer}
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
    names: list[str] = []
    seen: set[str] = set()
    candidates = [value.name for value in model.graph.input if value.name not in initializers]
    candidates += [output for node in model.graph.node for output in node.output if output]
    for name in candidates:
        if name not in seen and types.get(name) in floats:
            seen.add(name)
            names.append(name)
    return names
