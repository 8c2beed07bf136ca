"""OpenVINO INT8 variants: NNCF quantizes OpenVINO's own model of the ONNX file, and the variant is that IR.

Why not the QDQ ONNX file ONNX Runtime runs: OpenVINO reads a QDQ graph through its ONNX frontend
and fuses the QuantizeLinear/DequantizeLinear pairs its own way, which can ruin a model (a text
detector's mask IoU fell from 0.974 on ONNX Runtime to 0.0013 on OpenVINO), while
`nncf.quantize(core.read_model(fp32.onnx), ...)`, NNCF's OpenVINO path, keeps it (0.95). So an
OpenVINO INT8 variant is built the way OpenVINO's own tools build one: FakeQuantize nodes placed by
NNCF's OpenVINO backend, saved with `openvino.save_model` and packed as one artifact
(`devices.artifacts.pack_openvino_ir`). Weights stay as NNCF left them: `compress_to_fp16=False`,
since save_model's default would also turn the float weights NNCF kept (biases, the float
remainder) into FP16.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from devices.artifacts import pack_openvino_ir
from workers.inspect import load_graph_only
from workers.quantize.nncf_common import (
    DEFAULT_SUBSET,
    calibration_dataset,
    ignored_scope,
    int8_recipe,
    model_type,
    quantization_preset,
    smooth_quant_parameters,
)

RUNTIME = "openvino"
PRECISIONS = ("int8",)
# NNCF's OpenVINO backend takes the same INT8 settings as its ONNX backend (workers.quantize.nncf_onnx).
OPTIONS = {
    "runtime", "tool", "preset", "model_type", "fast_bias_correction", "smooth_quant_alpha", "nodes_to_exclude",
    "ignored_types", "max_calibration_samples",
}


def _feed_names(model_path: Path) -> list[str]:
    graph = load_graph_only(model_path).graph
    initializers = {tensor.name for tensor in graph.initializer}
    return [value.name for value in graph.input if value.name not in initializers]


def build_int8_ir(model_path: Path, out_path: Path, *, calibration_path: str | Path, options: dict[str, Any]) -> dict[str, Any]:
    """nncf.quantize on OpenVINO's model of `model_path`; write the packed IR to `out_path` and return the recipe."""
    import nncf
    import openvino as ov

    model = ov.Core().read_model(str(model_path))
    dataset, subset = calibration_dataset(_feed_names(model_path), calibration_path,
                                          options.get("max_calibration_samples") or DEFAULT_SUBSET)
    alpha = options.get("smooth_quant_alpha")
    quantized = nncf.quantize(
        model, dataset, preset=quantization_preset(options), model_type=model_type(options), subset_size=subset,
        fast_bias_correction=bool(options.get("fast_bias_correction", True)), ignored_scope=ignored_scope(options),
        advanced_parameters=smooth_quant_parameters(alpha),
    )
    with tempfile.TemporaryDirectory(dir=out_path.parent, prefix=".ir-") as scratch:
        xml_path = Path(scratch) / "model.xml"
        ov.save_model(quantized, str(xml_path), compress_to_fp16=False)
        pack_openvino_ir(xml_path, xml_path.with_suffix(".bin"), out_path)
    return {**int8_recipe(options, tool=f"nncf {nncf.__version__} (OpenVINO backend)", alpha_note=alpha, samples=subset),
            "quant_format": "OpenVINO IR (FakeQuantize)", "openvino": ov.get_version().split("-")[0]}
