"""INT8 and INT4 variants built with NNCF's ONNX backend, so the artifact stays a (QDQ) ONNX model.

What nncf 3.4's ONNX backend accepts (checked against its source, `nncf/onnx/quantization/
quantize_model.py` and `nncf/quantization/quantize_model.py`): `nncf.quantize` with `preset`,
`model_type=TRANSFORMER`, `ignored_scope`, `fast_bias_correction`, `subset_size`, and SmoothQuant
through `AdvancedQuantizationParameters(smooth_quant_alphas=...)` (there is an ONNX SmoothQuant
backend); `target_device=CPU_SPR` is refused. `nncf.compress_weights` accepts INT4_SYM/INT4_ASYM/
INT8 modes with `ratio`, `group_size`, `sensitivity_metric`, `awq` and `scale_estimation`;
NF4/FP4/MX/codebook modes, `gptq` and `lora_correction` are refused for ONNX. With opset < 21,
INT4 blocks become `com.microsoft.MatMulNBits` (ONNX Runtime only); opset 21 gets DequantizeLinear
with `block_size`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import onnx

from workers.quantize.nncf_common import (
    DEFAULT_SUBSET,
    calibration_dataset,
    ignored_scope,
    int8_recipe,
    model_type,
    quantization_preset,
    smooth_quant_parameters,
)

logger = logging.getLogger(__name__)

NNCF_INT8_OPTIONS = {
    "tool", "preset", "model_type", "fast_bias_correction", "smooth_quant_alpha", "nodes_to_exclude",
    "ignored_types", "max_calibration_samples",
}
NNCF_INT4_OPTIONS = {
    "tool", "ratio", "block_size", "symmetric", "nodes_to_exclude", "sensitivity_metric", "awq",
    "scale_estimation", "max_calibration_samples",
}


def _feed_names(model: onnx.ModelProto) -> list[str]:
    initializers = {tensor.name for tensor in model.graph.initializer}
    return [value.name for value in model.graph.input if value.name not in initializers]


def _dataset(model: onnx.ModelProto, calibration_path: str | Path, limit: int | None):
    return calibration_dataset(_feed_names(model), calibration_path, limit)


def build_int8(model_path: Path, out_path: Path, *, calibration_path: str | Path, options: dict[str, Any]) -> dict[str, Any]:
    """nncf.quantize on the ONNX model; return the recipe."""
    import nncf

    from workers.convert import save_model

    model = onnx.load(str(model_path))
    dataset, subset = _dataset(model, calibration_path, options.get("max_calibration_samples") or DEFAULT_SUBSET)
    transformer = model_type(options)
    alpha = options.get("smooth_quant_alpha")
    fast_bias_correction = bool(options.get("fast_bias_correction", True))
    smooth_quant_note = None
    if not fast_bias_correction and (transformer is not None or (alpha is not None and alpha >= 0)):
        # nncf 3.4 (ONNX): full BiasCorrection after SmoothQuant inserts a tensor name twice and
        # the model no longer loads ("Duplicate definition-site ... nncf_smooth_quant_output").
        alpha = -1
        smooth_quant_note = "off: nncf 3.4's ONNX BiasCorrection breaks SmoothQuant models"
    quantized = nncf.quantize(
        model, dataset, preset=quantization_preset(options), model_type=transformer, subset_size=subset,
        fast_bias_correction=fast_bias_correction, ignored_scope=ignored_scope(options),
        advanced_parameters=smooth_quant_parameters(alpha),
    )
    save_model(quantized, out_path)
    alpha_note = (smooth_quant_note or alpha) if alpha is not None else None
    return {**int8_recipe(options, tool=f"nncf {nncf.__version__} (ONNX backend)", alpha_note=alpha_note, samples=subset),
            "quant_format": "QDQ"}


def build_int4(model_path: Path, out_path: Path, *, calibration_path: str | Path | None, options: dict[str, Any]) -> dict[str, Any]:
    """nncf.compress_weights to INT4 (the most sensitive share in INT8 when `ratio` < 1); return the recipe."""
    import nncf

    from workers.convert import save_model

    model = onnx.load(str(model_path))
    symmetric = bool(options.get("symmetric", True))
    mode = nncf.CompressWeightsMode.INT4_SYM if symmetric else nncf.CompressWeightsMode.INT4_ASYM
    ratio = float(options.get("ratio", 1.0))
    group_size = int(options.get("block_size", 32))
    awq = bool(options.get("awq", False))
    scale_estimation = bool(options.get("scale_estimation", False))
    metric_name = options.get("sensitivity_metric")
    needs_data = awq or scale_estimation or (ratio < 1.0 and metric_name not in (None, "weight_quantization_error"))
    dataset = None
    if needs_data:
        if calibration_path is None:
            raise ValueError("this INT4 recipe (awq, scale estimation or a data-aware ratio) needs a calibration dataset")
        dataset, _ = _dataset(model, calibration_path, options.get("max_calibration_samples") or 128)
    metric = None
    if metric_name:
        metric = nncf.SensitivityMetric(metric_name)
    compressed = nncf.compress_weights(
        model, mode=mode, ratio=ratio, group_size=group_size, ignored_scope=ignored_scope(options),
        dataset=dataset, sensitivity_metric=metric, awq=awq or None, scale_estimation=scale_estimation or None,
        all_layers=True,
    )
    save_model(compressed, out_path)
    return {
        "method": "weight_only",
        "tool": f"nncf {nncf.__version__} compress_weights (ONNX backend)",
        "bits": 4,
        "mode": mode.value,
        "ratio": ratio,
        "backup_precision": "int8_asym",
        "block_size": group_size,
        "sensitivity_metric": metric_name or "nncf default",
        "awq": awq,
        "scale_estimation": scale_estimation,
        "nodes_excluded": list(options.get("nodes_to_exclude") or []),
    }
