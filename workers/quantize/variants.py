"""Build one precision variant of a model file and describe the recipe that produced it."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

from workers.convert import LARGE_MODEL_BYTES, save_model
from workers.datasets import InvalidDataset, dataset_samples
from workers.inspect import load_graph_only, model_files, model_size_bytes
from workers.quantize.backends import runnable_backends

logger = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16", "int8", "int8-dynamic", "int4-weight")
# Fewer samples than this give activation ranges that are mostly noise.
MIN_CALIBRATION_SAMPLES = 8
INT4_BLOCK_SIZE = 32

_CALIBRATION_METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile", "distribution": "Distribution"}

_OPTIONS = {
    "fp32": set(),
    "fp16": {"op_block_list"},
    "int8": {
        "calibration_method", "per_channel", "nodes_to_exclude", "op_types_to_quantize",
        "max_calibration_samples", "calibration_batch_size", "skip_preprocess",
    },
    "int8-dynamic": {"per_channel", "nodes_to_exclude", "op_types_to_quantize"},
    "int4-weight": {"block_size", "nodes_to_exclude", "symmetric"},
}


class NotApplicable(Exception):
    """This precision makes no sense for this model (e.g. int4 weights without MatMul weights)."""


class QuantizationError(Exception):
    """The variant could not be built; the message says why in words a user can act on."""


def build_variant(
    *,
    model_path: str | Path,
    precision: str,
    out_path: str | Path,
    calibration_path: str | Path | None = None,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build `precision` from the model at `model_path` into `out_path`; return precision, recipe, backends, size."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    options = dict(options or {})
    unknown = set(options) - _OPTIONS[precision]
    if unknown:
        raise ValueError(f"unknown option(s) for {precision}: {', '.join(sorted(unknown))}")
    model_path, out_path = Path(model_path), Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)

    builders: dict[str, Callable[..., dict[str, Any]]] = {
        "fp32": _build_fp32,
        "fp16": _build_fp16,
        "int8": _build_int8_static,
        "int8-dynamic": _build_int8_dynamic,
        "int4-weight": _build_int4_weight,
    }
    try:
        recipe = builders[precision](model_path, out_path, calibration_path=calibration_path, options=options)
        backends = runnable_backends(out_path)
        if not backends:
            raise QuantizationError(f"the {precision} variant was built but no runtime on this host can load it")
        size_bytes = model_size_bytes(out_path)
    except BaseException:
        # A half-written artifact must not look like a finished one to a retried task.
        _remove_outputs(out_path)
        raise
    return {"precision": precision, "recipe": recipe, "backends": backends, "size_bytes": size_bytes}


def _remove_outputs(out_path: Path) -> None:
    out_path.unlink(missing_ok=True)
    out_path.with_name(out_path.name + ".data").unlink(missing_ok=True)


def _build_fp32(model_path: Path, out_path: Path, **_: Any) -> dict[str, Any]:
    files = model_files(model_path)
    if len(files) == 1:
        shutil.copyfile(model_path, out_path)
    else:
        # External-data names could collide with other variants in one folder; rename to `<out>.data`.
        save_model(onnx.load(str(model_path)), out_path)
    return {"method": "copy"}


def _build_fp16(model_path: Path, out_path: Path, *, options: dict[str, Any], **_: Any) -> dict[str, Any]:
    from onnxruntime.transformers.float16 import (
        DEFAULT_OP_BLOCK_LIST,
        convert_float_to_float16,
    )

    custom_block_list = options.get("op_block_list")
    op_block_list = list(custom_block_list or DEFAULT_OP_BLOCK_LIST)
    try:
        converted = convert_float_to_float16(
            onnx.load(str(model_path)),
            # Callers keep feeding float32 and reading float32; casts sit at the edges.
            keep_io_types=True,
            op_block_list=op_block_list,
            # Shape inference on a >2 GB proto would fail inside the converter.
            disable_shape_infer=model_size_bytes(model_path) > LARGE_MODEL_BYTES,
        )
    except Exception as error:
        raise QuantizationError(f"float16 conversion failed: {error}") from error
    save_model(converted, out_path)
    return {
        "method": "float16",
        "tool": "onnxruntime.transformers.float16",
        "keep_io_types": True,
        "op_block_list": sorted(set(custom_block_list)) if custom_block_list else "onnxruntime default",
    }


def _build_int8_static(
    model_path: Path, out_path: Path, *, calibration_path: str | Path | None, options: dict[str, Any]
) -> dict[str, Any]:
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    from workers.quantize.calibration import NpzCalibrationReader

    if calibration_path is None:
        raise QuantizationError("int8 needs a calibration dataset")
    limit = options.get("max_calibration_samples")
    try:
        available = dataset_samples(calibration_path)
    except InvalidDataset as error:
        raise QuantizationError(f"calibration dataset unusable: {error}") from error
    usable = min(available, limit) if limit else available
    if usable < MIN_CALIBRATION_SAMPLES:
        raise QuantizationError(
            f"calibration set has {usable} samples; int8 needs at least {MIN_CALIBRATION_SAMPLES} "
            "to estimate activation ranges"
        )
    method_key = str(options.get("calibration_method", "minmax")).lower()
    if method_key not in _CALIBRATION_METHODS:
        raise ValueError(f"unknown calibration_method {method_key!r}; choose one of {', '.join(_CALIBRATION_METHODS)}")
    per_channel = bool(options.get("per_channel", True))
    nodes_to_exclude = list(options.get("nodes_to_exclude") or [])
    large = model_size_bytes(model_path) > LARGE_MODEL_BYTES
    model = load_graph_only(model_path)
    input_names = _feed_names(model)

    with tempfile.TemporaryDirectory(dir=out_path.parent, prefix=".int8-") as scratch:
        source, preprocess = _preprocess(model_path, Path(scratch), skip=bool(options.get("skip_preprocess")), large=large)
        batch_size, static = _calibration_batch_size(model, options)
        if static:
            # A fixed-batch model cannot take a short last batch; calibrate on whole batches only.
            limit = usable - usable % batch_size
            if limit == 0:
                raise QuantizationError(f"the model takes batches of {batch_size}; the calibration set has only {usable} samples")
        elif method_key != "minmax":
            # ORT's histogram calibrators stack per-batch outputs and break on a ragged last batch.
            batch_size = 1
        reader = NpzCalibrationReader(calibration_path, input_names=input_names, batch_size=batch_size, limit=limit)
        try:
            quantize_static(
                str(source),
                str(out_path),
                reader,
                quant_format=QuantFormat.QDQ,
                op_types_to_quantize=options.get("op_types_to_quantize"),
                per_channel=per_channel,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                nodes_to_exclude=nodes_to_exclude,
                use_external_data_format=large,
                calibrate_method=getattr(CalibrationMethod, _CALIBRATION_METHODS[method_key]),
                extra_options={"WeightSymmetric": True, "ActivationSymmetric": False},
            )
        except InvalidDataset as error:
            raise QuantizationError(f"calibration dataset unusable: {error}") from error
        except Exception as error:
            raise QuantizationError(f"static int8 quantization failed: {error}") from error
    return {
        "method": "static",
        "quant_format": "QDQ",
        "calibration_method": _CALIBRATION_METHODS[method_key],
        "per_channel": per_channel,
        "weight_type": "int8",
        "weight_symmetric": True,
        "activation_type": "uint8",
        "activation_symmetric": False,
        "samples": reader.samples_read,
        "preprocess": preprocess,
        "nodes_excluded": nodes_to_exclude,
        "op_types": options.get("op_types_to_quantize") or "all supported",
    }


def _preprocess(model_path: Path, scratch: Path, *, skip: bool, large: bool) -> tuple[Path, str]:
    """Run ORT's recommended pre-quantization pass; on failure quantize the model as it is."""
    if skip:
        return model_path, "skipped: turned off by option"
    from onnxruntime.quantization.shape_inference import quant_pre_process

    output = scratch / "preprocessed.onnx"
    try:
        quant_pre_process(
            str(model_path), str(output), save_as_external_data=large, all_tensors_to_one_file=True,
            external_data_location="preprocessed.onnx.data",
        )
    except Exception as error:  # noqa: BLE001 - a best-effort pass, never a reason to fail
        logger.info("quant_pre_process failed on %s: %s", model_path.name, error)
        return model_path, f"skipped: {type(error).__name__}: {error}"
    return output, "applied"


def _build_int8_dynamic(model_path: Path, out_path: Path, *, options: dict[str, Any], **_: Any) -> dict[str, Any]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    per_channel = bool(options.get("per_channel", False))
    nodes_to_exclude = list(options.get("nodes_to_exclude") or [])
    try:
        quantize_dynamic(
            str(model_path),
            str(out_path),
            op_types_to_quantize=options.get("op_types_to_quantize"),
            per_channel=per_channel,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=nodes_to_exclude,
            use_external_data_format=model_size_bytes(model_path) > LARGE_MODEL_BYTES,
        )
    except Exception as error:
        raise QuantizationError(f"dynamic int8 quantization failed: {error}") from error
    return {
        "method": "dynamic",
        "quant_format": "QOperator",
        "weight_type": "int8",
        "per_channel": per_channel,
        "activations": "quantized at run time (DynamicQuantizeLinear)",
        "nodes_excluded": nodes_to_exclude,
        "op_types": options.get("op_types_to_quantize") or "all supported",
    }


def _build_int4_weight(model_path: Path, out_path: Path, *, options: dict[str, Any], **_: Any) -> dict[str, Any]:
    nodes_to_exclude = list(options.get("nodes_to_exclude") or [])
    eligible = _matmuls_with_weights(load_graph_only(model_path), exclude=set(nodes_to_exclude))
    if not eligible:
        raise NotApplicable("int4-weight needs MatMul weights; this model has none")
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    except ImportError as error:
        # onnxruntime's quantizer imports onnx_ir, which onnxruntime does not declare as a dependency.
        raise QuantizationError(f"int4-weight needs the onnx-ir package: {error}") from error

    block_size = int(options.get("block_size", INT4_BLOCK_SIZE))
    symmetric = bool(options.get("symmetric", True))
    large = model_size_bytes(model_path) > LARGE_MODEL_BYTES
    try:
        quantizer = MatMulNBitsQuantizer(
            onnx.load(str(model_path)),
            bits=4,
            block_size=block_size,
            is_symmetric=symmetric,
            nodes_to_exclude=nodes_to_exclude,
            op_types_to_quantize=("MatMul",),
        )
        quantizer.process()
        quantized = sum(1 for node in quantizer.model.model.graph.node if node.op_type == "MatMulNBits")
        if not quantized:
            raise NotApplicable("int4-weight found no MatMul weight it could quantize in this model")
        quantizer.model.save_model_to_file(str(out_path), use_external_data_format=large)
    except NotApplicable:
        raise
    except Exception as error:
        raise QuantizationError(f"int4 weight quantization failed: {error}") from error
    return {
        "method": "weight_only",
        "bits": 4,
        "block_size": block_size,
        "symmetric": symmetric,
        "op_types": ["MatMul"],
        "operator": "com.microsoft.MatMulNBits",
        "quantized_nodes": quantized,
        "nodes_excluded": nodes_to_exclude,
    }


def _matmuls_with_weights(model: onnx.ModelProto, *, exclude: set[str]) -> list[str]:
    """Names of MatMul nodes whose right-hand side is a 2-D initializer (what MatMulNBits replaces)."""
    weights = {tensor.name: tensor for tensor in model.graph.initializer}
    return [
        node.name
        for node in model.graph.node
        if node.op_type == "MatMul"
        and node.name not in exclude
        and len(node.input) > 1
        and node.input[1] in weights
        and len(weights[node.input[1]].dims) == 2
    ]


def _feed_names(model: onnx.ModelProto) -> list[str]:
    initializers = {tensor.name for tensor in model.graph.initializer}
    return [value.name for value in model.graph.input if value.name not in initializers]


def _calibration_batch_size(model: onnx.ModelProto, options: dict[str, Any]) -> tuple[int, bool]:
    """Return (batch size, whether the model fixes it) for feeding calibration data."""
    requested = int(options.get("calibration_batch_size", 16))
    initializers = {tensor.name for tensor in model.graph.initializer}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims = value.type.tensor_type.shape.dim
        # A static leading dim is a fixed batch the model cannot be fed differently.
        if dims and dims[0].HasField("dim_value") and dims[0].dim_value > 0:
            return int(dims[0].dim_value), True
    return requested, False
