"""ONNX Runtime's own calibration methods (MinMax, Entropy, Percentile, Distribution), streamed within the build budget.

The ranges are the ones onnxruntime's calibrators give when handed every sample at once (tests/workers/quantize/
test_streaming.py compares them), computed from `ActivationStream`'s two passes instead of from every intermediate
output of every sample: MinMax from the in-graph reductions; the histogram methods from histograms whose range is
the one ORT's first (and, handed everything at once, only) `collect` call would take, so that per-batch counts add up
to its counts exactly. ORT's own `HistogramCollector` then picks the thresholds, and the result goes to
`quantize_static` as its calibration cache.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx

from workers.quantize.streaming import HISTOGRAM_CHUNK, ActivationStream, TensorStats

# onnxruntime.quantization.calibrate.create_calibrator's settings for each method when no calibration extra option is
# given (Kiln passes none): what `quantize_static` would have used.
ORT_HISTOGRAM_SETTINGS = {
    "Entropy": {"method": "entropy", "symmetric": False, "num_bins": 128, "num_quantized_bins": 128, "percentile": 99.999, "scenario": "same"},
    "Percentile": {"method": "percentile", "symmetric": True, "num_bins": 2048, "num_quantized_bins": 2048, "percentile": 99.999, "scenario": "same"},
    "Distribution": {"method": "distribution", "symmetric": False, "num_bins": 2048, "num_quantized_bins": 128, "percentile": 99.999, "scenario": "same"},
}


def ort_calibration_tensors(model_path: str | Path, op_types: list[str] | None) -> list[str]:
    """The tensors ORT's calibrator would observe: inputs and outputs of (the given types of) nodes, float after shape inference."""
    from onnxruntime.quantization.calibrate import CalibraterBase
    from onnxruntime.quantization.quant_utils import load_model_with_shape_infer

    from workers.convert import save_model

    with tempfile.TemporaryDirectory(prefix="kiln-ort-cal-") as scratch:
        # ORT's own loader (shape inference through a file), on a copy: it writes its inferred model beside the one it reads.
        copy = Path(scratch) / "model.onnx"
        save_model(onnx.load(str(model_path)), copy)
        model = load_model_with_shape_infer(copy)
    chooser = SimpleNamespace(op_types_to_calibrate=op_types)
    tensors, _ = CalibraterBase.select_tensors_to_calibrate(chooser, model)
    order = {name: index for index, name in enumerate(
        [value.name for value in model.graph.input] + [output for node in model.graph.node for output in node.output])}
    return sorted(tensors, key=lambda name: order.get(name, len(order)))


def ort_ranges(model_path: str | Path, calibration_path: str | Path, *, method: str, limit: int,
               op_types: list[str] | None = None, batch_size: int = 16, what: str = "int8 calibration"):
    """(TensorsData as ORT's calibrator for `method` gives it, ActivationStream with its plan) over `limit` samples."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, HistogramCollector, TensorsData

    names = ort_calibration_tensors(model_path, op_types)
    with ActivationStream(model_path, names, batch_size=batch_size, what=what) as stream:
        if method == "MinMax":
            stats = stream.reduce(calibration_path, limit=limit)
            # ORT's MinMax keeps each range as the 1-element arrays its Reshape([-1]) of ReduceMin/ReduceMax makes.
            ranges = {name: (np.array([item.minimum]), np.array([item.maximum])) for name, item in stats.items()}
            return TensorsData(CalibrationMethod.MinMax, ranges), stream
        settings = ORT_HISTOGRAM_SETTINGS[method]
        absolute = settings["method"] == "percentile" and settings["symmetric"]
        stats = stream.reduce(calibration_path, limit=limit, absolute_minimum=absolute)
        histograms = {name: _OrtHistogram(item, settings["num_bins"], absolute) for name, item in stats.items()}
        for _group, batches in stream.groups(calibration_path, limit=limit):
            for _rows, activations in batches:
                for name, values in activations.items():
                    histograms[name].add(values)
        collector = HistogramCollector(**settings)
        collector.histogram_dict = {name: histogram.as_ort() for name, histogram in histograms.items()}
        return TensorsData(getattr(CalibrationMethod, method), collector.compute_collection_result()), stream


class _OrtHistogram:
    """The histogram one `HistogramCollector.collect` call over every sample would make, filled batch by batch.

    Its range is fixed by pass 1 exactly as ORT computes it from all the data (±max|x| for values; [min|x|, max|x|]
    for magnitudes), and numpy's equal-bin histogram assigns a value to the same bin whatever else is in the call.
    """

    def __init__(self, stats: TensorStats, bins: int, absolute: bool):
        self.stats, self.bins, self.absolute = stats, bins, absolute
        dtype = stats.dtype
        if absolute:
            top = np.maximum(np.abs(stats.minimum), np.abs(stats.maximum))
            self.range = (dtype.type(stats.abs_minimum), dtype.type(top))
        else:
            self.threshold = np.array(max(abs(stats.minimum), abs(stats.maximum)), dtype=dtype)
            self.range = (-self.threshold, self.threshold)
        self.counts = np.zeros(bins, dtype=np.int64)
        self.edges = np.histogram(np.empty(0, dtype=dtype), bins, range=self.range)[1]

    def add(self, values: np.ndarray) -> None:
        flat = np.asarray(values).reshape(-1)
        for start in range(0, flat.size, HISTOGRAM_CHUNK):
            chunk = flat[start:start + HISTOGRAM_CHUNK]
            self.counts += np.histogram(np.absolute(chunk) if self.absolute else chunk, self.bins, range=self.range)[0]

    def as_ort(self) -> tuple:
        if self.absolute:
            return self.counts, self.edges.astype(self.stats.dtype), self.stats.minimum, self.stats.maximum
        return self.counts, self.edges, self.stats.minimum, self.stats.maximum, self.threshold


def write_ort_cache(tensors_data, path: str | Path) -> Path:
    """Write ranges where `quantize_static(calibration_cache_path=...)` reads them (it checks the method matches)."""
    from onnxruntime.quantization.calibrate import save_tensors_data

    save_tensors_data(tensors_data, path)
    return Path(path)

