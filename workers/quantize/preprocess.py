"""What a model goes through before ONNX Runtime's quantizer writes its INT8 graph: ORT's pre-quantization pass, and the
opset a per-channel graph needs. The INT8 builds (workers.quantize.variants) and learning (workers.learned.recipes),
which learns against the very graph the quantizer quantized, both prepare the model here."""

from __future__ import annotations

import logging
from pathlib import Path

from workers.convert import upgrade_opset
from workers.quantize.errors import QuantizationError
from workers.workdir import working_directory

logger = logging.getLogger(__name__)


def preprocess_for_quantization(model_path: Path, scratch: Path, *, skip: bool, large: bool) -> tuple[Path, str]:
    """Run ORT's recommended pre-quantization pass (shape inference, BatchNormalization folded into convolutions, ...);
    on failure quantize the model as it is. Returns the model to quantize and what was done."""
    if skip:
        return model_path, "skipped: turned off by option"
    from onnxruntime.quantization.shape_inference import quant_pre_process

    output = scratch / "preprocessed.onnx"
    try:
        # Its shape inference drops scratch files into the current directory when some shape stays unknown.
        with working_directory(scratch):
            quant_pre_process(
                str(model_path), str(output), save_as_external_data=large, all_tensors_to_one_file=True,
                external_data_location="preprocessed.onnx.data",
            )
    except Exception as error:
        logger.info("quant_pre_process failed on %s: %s", model_path.name, error)
        return model_path, f"skipped: {type(error).__name__}: {error}"
    return output, "applied"


# DequantizeLinear takes a per-channel `axis` from opset 13 on; below it, a per-channel QDQ graph is invalid and no runtime loads it.
PER_CHANNEL_OPSET = 13


def per_channel_opset(source: Path, scratch: Path) -> Path:
    """`source` at opset 13 or later, converted when older (three real models of the zoo are at opsets 11 and 12): ORT's
    quantizer writes per-channel DequantizeLinear nodes with `axis` whatever the model's opset, into a graph nothing loads.
    (An upload's conversion stage already raises the opset; a model handed to `build_variant` directly may not have had it.)"""
    output = scratch / f"opset{PER_CHANNEL_OPSET}.onnx"
    try:
        skipped = upgrade_opset(source, output, target_opset=PER_CHANNEL_OPSET)
    except Exception as error:
        raise QuantizationError(f"per-channel int8 needs ONNX opset {PER_CHANNEL_OPSET}, and converting this model failed "
                                f"({type(error).__name__}: {error}); set per_channel to false") from error
    return source if skipped else output
