"""Build one precision variant of an ONNX model (fp32, fp16, int8, int8-dynamic, int4-weight), and search for the best one.

`search.plan_round` plans the rounds of `precisions: auto` and `verdicts` says which families paid; `sensitivity.rank_nodes`
ranks nodes by quantization error; `cache.variant_cache_key` names reusable builds;
`calibration_methods` estimates activation ranges (MinMax, Percentile, Entropy, MSE).
"""

from workers.quantize.backends import runnable_backends
from workers.quantize.calibration import NpzCalibrationReader
from workers.quantize.errors import NotApplicable, QuantizationError
from workers.quantize.variants import MIN_CALIBRATION_SAMPLES, PRECISIONS, build_variant

__all__ = [
    "MIN_CALIBRATION_SAMPLES",
    "PRECISIONS",
    "NotApplicable",
    "NpzCalibrationReader",
    "QuantizationError",
    "build_variant",
    "runnable_backends",
]
