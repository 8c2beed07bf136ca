"""What NNCF's ONNX and OpenVINO backends share: the calibration data from an .npz, the ignored scope, the INT8 settings.

`workers.quantize.nncf_onnx` quantizes the ONNX graph (a QDQ ONNX file, for ONNX Runtime);
`workers.quantize.nncf_openvino` quantizes OpenVINO's own model read from the same file (an IR,
for OpenVINO). Both read the calibration set and a recipe's options the same way, here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workers.datasets import dataset_samples, iter_batches

DEFAULT_SUBSET = 300
PRESETS = ("performance", "mixed")


class NpzBatches:
    """A re-iterable view of an .npz (NNCF may pass over the data more than once)."""

    def __init__(self, path: str | Path, input_names: list[str], limit: int):
        self.path, self.input_names, self.limit = Path(path), input_names, limit

    def __iter__(self):
        # One sample per item: NNCF counts `subset_size` in items and assumes batch 1.
        return iter_batches(self.path, input_names=self.input_names, batch_size=1, limit=self.limit)


def calibration_dataset(input_names: list[str], calibration_path: str | Path, limit: int | None):
    """An `nncf.Dataset` of `{input name: one sample}` items from the .npz, and how many samples it holds."""
    import nncf

    samples = dataset_samples(calibration_path)
    limit = min(samples, limit) if limit else samples
    return nncf.Dataset(NpzBatches(calibration_path, input_names, limit)), limit


def ignored_scope(options: dict[str, Any]):
    """The nodes (`nodes_to_exclude`) and operation types (`ignored_types`) a recipe keeps in float, or None."""
    import nncf

    names = list(options.get("nodes_to_exclude") or [])
    types = list(options.get("ignored_types") or [])
    if not names and not types:
        return None
    # validate=False: a keep-in-float list from the sensitivity ranking may name nodes NNCF never quantizes.
    return nncf.IgnoredScope(names=names, types=types, validate=False)


def quantization_preset(options: dict[str, Any]):
    """NNCF's preset for the recipe's `preset` (None: NNCF's default, performance)."""
    import nncf

    name = options.get("preset")
    if name is None:
        return None
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return {"performance": nncf.QuantizationPreset.PERFORMANCE, "mixed": nncf.QuantizationPreset.MIXED}[name]


def model_type(options: dict[str, Any]):
    """NNCF's transformer model type when the recipe asks for it, else None."""
    import nncf

    return nncf.ModelType.TRANSFORMER if options.get("model_type") == "transformer" else None


def smooth_quant_parameters(alpha: float | None):
    """Advanced parameters that set SmoothQuant's alpha for MatMuls (convolutions are never smoothed), or None for NNCF's default."""
    if alpha is None:
        return None
    from nncf.quantization.advanced_parameters import (
        AdvancedQuantizationParameters,
        AdvancedSmoothQuantParameters,
    )

    return AdvancedQuantizationParameters(
        smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=float(alpha), convolution=-1)
    )


def int8_recipe(options: dict[str, Any], *, tool: str, alpha_note: Any, samples: int) -> dict[str, Any]:
    """What an NNCF INT8 build records: the settings it ran with, in the words the report shows."""
    model_type_name = options.get("model_type")
    return {
        "method": "static",
        "tool": tool,
        "preset": options.get("preset") or "nncf default (performance)",
        "model_type": model_type_name or "default",
        "fast_bias_correction": bool(options.get("fast_bias_correction", True)),
        "smooth_quant_alpha": alpha_note if alpha_note is not None else (
            "nncf default (0.95 for transformer)" if model_type_name == "transformer" else "off"),
        "samples": samples,
        "nodes_excluded": list(options.get("nodes_to_exclude") or []),
        "ignored_types": list(options.get("ignored_types") or []),
    }
