"""Build one precision variant of a model file and describe the recipe that produced it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

from devices.artifacts import ONNX, artifact_format
from kiln_contract import contract
from workers.convert import LARGE_MODEL_BYTES, save_model
from workers.datasets import InvalidDataset, dataset_samples
from workers.inspect import load_graph_only, model_files, model_size_bytes
from workers.learned.options import LEARN_OPTIONS
from workers.quantize.backends import load_check
from workers.quantize.errors import NotApplicable, QuantizationError
from workers.quantize.preprocess import per_channel_opset, preprocess_for_quantization
from workers.workdir import working_directory

# What a build makes: every precision of the contract but bf16, which is FP32's build run under a bf16 hint.
PRECISIONS = tuple(precision for precision in contract.PRECISIONS if precision != contract.BF16)
# Fewer samples than this give activation ranges that are mostly noise.
MIN_CALIBRATION_SAMPLES = 8
INT4_BLOCK_SIZE = 32

_CALIBRATION_METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile", "distribution": "Distribution"}
# Computed by Kiln's own streaming calibrator (workers.quantize.calibration_methods), not onnxruntime's.
_KILN_ONLY_METHODS = {"mse": "MSE"}
_INTEGER_TYPES = {"uint8": "QUInt8", "int8": "QInt8"}
# How ONNX Runtime's static INT8 graph is written: QDQ (QuantizeLinear/DequantizeLinear around float operators, fused by
# the runtime; what learning and other runtimes read) or QOperator (QLinearConv, QLinearMatMul, …: integer operators
# written out). Which one ORT runs faster depends on the model and the CPU, so the search measures both (issue 24).
QUANT_FORMATS = {"qdq": "QDQ", "qoperator": "QOperator"}
FP16_MAX = 65504.0

# `runtime: "litert"` builds the precision as a LiteRT flatbuffer instead (workers.quantize.litert).
_OPTIONS = {
    "fp32": {"runtime"},
    "fp16": {"op_block_list", "runtime"},
    "int8": {
        "runtime",
        "calibration_method", "per_channel", "nodes_to_exclude", "op_types_to_quantize",
        "max_calibration_samples", "calibration_batch_size", "skip_preprocess",
        # Kiln's calibrator and the device's integer scheme (workers.quantize.schemes).
        "calibrator", "percentile", "activation_type", "weight_type", "reduce_range", "quant_format",
        # NNCF's ONNX backend (workers.quantize.nncf_onnx), with tool="nncf".
        "tool", "preset", "model_type", "fast_bias_correction", "smooth_quant_alpha", "ignored_types",
        # Equalization before calibration (workers.quantize.smoothing) and which ops' outputs stay float.
        "smooth_quant", "float_outputs",
        # Learned rounding on top of the calibration (workers.learned).
        *LEARN_OPTIONS,
    },
    "int8-dynamic": {"per_channel", "nodes_to_exclude", "op_types_to_quantize"},
    "int4-weight": {
        "block_size", "nodes_to_exclude", "symmetric",
        # Mixes (workers.quantize.mixed) and NNCF's compress_weights with tool="nncf".
        "int8_nodes", "gemm_to_matmul", "tool", "ratio", "sensitivity_metric", "awq", "scale_estimation",
        "max_calibration_samples",
    },
}


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
    builder = builders[precision]
    if options.get("runtime") is not None:
        builder = _runtime_builder(precision, options)
    if options.get("learn"):
        builder = _learned_builder(builder)
    if options.get("smooth_quant"):
        # Outermost: calibration, learning and the FP32 teacher all see the smoothed graph, which computes the same function.
        builder = _smoothed_builder(builder)
    try:
        recipe = builder(model_path, out_path, calibration_path=calibration_path, options=options)
        backends, refused = load_check(out_path)
        if not backends:
            raise QuantizationError(f"the {precision} variant was built but no runtime on this host can load it")
        # Only an ONNX model may have an external-data file beside it; the other formats are one file.
        size_bytes = model_size_bytes(out_path) if artifact_format(out_path) == ONNX else out_path.stat().st_size
    except BaseException:
        # A half-written artifact must not look like a finished one to a retried task.
        _remove_outputs(out_path)
        raise
    # What the file holds (`onnx`, `tflite`, `openvino-ir`): the pipeline names and packages the artifact by it.
    # A runtime that refuses the file is told with its reason (`refused_backends`), so that the job can say why it was not measured there.
    return {"precision": precision, "recipe": recipe, "backends": backends, "refused_backends": refused, "size_bytes": size_bytes,
            "format": artifact_format(out_path)}


def _runtime_builder(precision: str, options: dict[str, Any]) -> Callable[..., dict[str, Any]]:
    """The builder of a variant made in another runtime's own format (LiteRT's `.tflite`, OpenVINO's IR)."""
    from workers.quantize import litert, nncf_openvino

    if options["runtime"] == nncf_openvino.RUNTIME:
        return _openvino_builder(precision, options)
    if options["runtime"] != litert.RUNTIME:
        raise ValueError(f"unknown runtime {options['runtime']!r}; the ones built in their own format are "
                         f"{litert.RUNTIME!r} and {nncf_openvino.RUNTIME!r}")
    unknown = sorted(set(options) - litert.OPTIONS)
    if unknown:
        raise ValueError(f"a LiteRT {precision} build takes no {', '.join(unknown)}")

    def build(model_path: Path, out_path: Path, *, calibration_path: str | Path | None, options: dict[str, Any]) -> dict[str, Any]:
        try:
            return litert.build_litert(model_path, out_path, precision=precision, calibration_path=calibration_path, options=options)
        except litert.ConversionError as error:
            raise QuantizationError(f"LiteRT {precision}: {error}") from error

    return build


def _openvino_builder(precision: str, options: dict[str, Any]) -> Callable[..., dict[str, Any]]:
    """The builder of an OpenVINO IR variant: INT8 quantized by NNCF on OpenVINO's own model (workers.quantize.nncf_openvino)."""
    from workers.quantize import nncf_openvino

    if precision not in nncf_openvino.PRECISIONS:
        raise ValueError(f"an OpenVINO IR build makes {', '.join(nncf_openvino.PRECISIONS)}, not {precision}")
    unknown = sorted(set(options) - nncf_openvino.OPTIONS - set(LEARN_OPTIONS))
    if unknown:
        raise ValueError(f"an OpenVINO {precision} build takes no {', '.join(unknown)}")
    if options.get("tool", "nncf") != "nncf":
        raise ValueError("an OpenVINO int8 build is NNCF's (tool: nncf)")

    def build(model_path: Path, out_path: Path, *, calibration_path: str | Path | None, options: dict[str, Any]) -> dict[str, Any]:
        usable = _usable_calibration_samples(calibration_path, options.get("max_calibration_samples"))
        try:
            return nncf_openvino.build_int8_ir(model_path, out_path, calibration_path=calibration_path,
                                               options={**options, "max_calibration_samples": usable})
        except Exception as error:
            raise QuantizationError(f"NNCF int8 quantization (OpenVINO backend) failed: {error}") from error

    return build


def _usable_calibration_samples(calibration_path: str | Path | None, limit: int | None) -> int:
    """How many calibration samples an INT8 build uses; QuantizationError when there is no set or too few samples."""
    if calibration_path is None:
        raise QuantizationError("int8 needs a calibration dataset")
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
    return usable


def _learned_builder(base_builder: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    from workers.learned.recipes import LearningNotApplicable, build_learned_int8

    def build(model_path: Path, out_path: Path, **kwargs: Any) -> dict[str, Any]:
        try:
            # ONNX Runtime's static INT8 is what learning calibrates on, also when the result is built for another runtime.
            return build_learned_int8(model_path, out_path, base_builder=base_builder, calibrator=_build_int8_static, **kwargs)
        except LearningNotApplicable as exc:
            raise NotApplicable(str(exc)) from exc

    return build


def _smoothed_builder(base_builder: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    from workers.quantize.smoothing import DEFAULT_ALPHAS, smooth_model

    def build(model_path: Path, out_path: Path, *, calibration_path: str | Path | None, options: dict[str, Any]) -> dict[str, Any]:
        if calibration_path is None:
            raise QuantizationError("smooth_quant needs a calibration dataset")
        if options.get("tool", "onnxruntime") != "onnxruntime":
            raise ValueError("smooth_quant is Kiln's rewrite for the onnxruntime tool; NNCF has its own smooth_quant_alpha")
        setting = options["smooth_quant"]
        alphas = DEFAULT_ALPHAS if setting in (True, "auto") else (float(setting),)
        if model_size_bytes(model_path) > LARGE_MODEL_BYTES:
            raise NotApplicable("smooth_quant rewrites the graph in memory; models over 2 GB are not smoothed")
        try:
            smoothed = smooth_model(model_path, calibration_path, alphas=alphas)
        except Exception as error:
            raise QuantizationError(f"smoothing failed: {error}") from error
        with tempfile.TemporaryDirectory(dir=out_path.parent, prefix=".smooth-") as scratch:
            smoothed_path = Path(scratch) / "smoothed.onnx"
            save_model(smoothed.model, smoothed_path)
            rest = {key: value for key, value in options.items() if key != "smooth_quant"}
            recipe = base_builder(smoothed_path, out_path, calibration_path=calibration_path, options=rest)
        return {**recipe, "smooth_quant": smoothed.summary()}

    return build


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


def _build_fp16(
    model_path: Path, out_path: Path, *, options: dict[str, Any], calibration_path: str | Path | None = None, **_: Any
) -> dict[str, Any]:
    from onnxruntime.transformers.float16 import (
        DEFAULT_OP_BLOCK_LIST,
        convert_float_to_float16,
    )

    custom_block_list = options.get("op_block_list")
    op_block_list = list(custom_block_list or DEFAULT_OP_BLOCK_LIST)
    if calibration_path is not None:
        _check_fp16_range(model_path, calibration_path)
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

    if calibration_path is None:
        raise QuantizationError("int8 needs a calibration dataset")
    tool = options.get("tool", "onnxruntime")
    if tool not in ("onnxruntime", "onnxruntime-defaults", "nncf"):
        raise ValueError(f"unknown tool {tool!r}; choose onnxruntime, onnxruntime-defaults or nncf")
    quant_format = str(options.get("quant_format", "qdq")).lower()
    if quant_format not in QUANT_FORMATS:
        raise ValueError(f"unknown quant_format {options.get('quant_format')!r}; choose {' or '.join(QUANT_FORMATS)}")
    if quant_format != "qdq" and (tool != "onnxruntime" or options.get("learn") or options.get("float_outputs")):
        raise QuantizationError("QOperator is built by ONNX Runtime's own quantizer, without learning or float outputs (those are QDQ's)")
    limit = options.get("max_calibration_samples")
    usable = _usable_calibration_samples(calibration_path, limit)
    method_key = str(options.get("calibration_method", "minmax")).lower()
    if method_key not in _CALIBRATION_METHODS and method_key not in _KILN_ONLY_METHODS:
        choices = ", ".join([*_CALIBRATION_METHODS, *_KILN_ONLY_METHODS])
        raise ValueError(f"unknown calibration_method {method_key!r}; choose one of {choices}")
    from workers.quantize.calibration_methods import (
        CalibrationError,
        check_sample_count,
    )

    try:
        check_sample_count(usable, method_key)
    except CalibrationError as error:
        raise QuantizationError(str(error)) from error
    if tool == "nncf":
        from workers.quantize.nncf_onnx import build_int8

        try:
            return build_int8(model_path, out_path, calibration_path=calibration_path, options={**options, "max_calibration_samples": usable})
        except Exception as error:
            raise QuantizationError(f"NNCF int8 quantization failed: {error}") from error
    if tool == "onnxruntime-defaults":
        return _build_int8_ort_defaults(model_path, out_path, calibration_path=calibration_path, samples=usable)
    kiln_calibrator = options.get("calibrator", "onnxruntime") == "kiln" or method_key in _KILN_ONLY_METHODS
    activation_name = str(options.get("activation_type", "uint8"))
    weight_name = str(options.get("weight_type", "int8"))
    if activation_name not in _INTEGER_TYPES or weight_name not in _INTEGER_TYPES:
        raise ValueError("activation_type and weight_type must be uint8 or int8")
    reduce_range = bool(options.get("reduce_range", False))
    per_channel = bool(options.get("per_channel", True))
    nodes_to_exclude = list(options.get("nodes_to_exclude") or [])
    float_outputs = list(options.get("float_outputs") or [])
    large = model_size_bytes(model_path) > LARGE_MODEL_BYTES
    model = load_graph_only(model_path)

    with tempfile.TemporaryDirectory(dir=out_path.parent, prefix=".int8-") as scratch:
        source, preprocess = preprocess_for_quantization(model_path, Path(scratch), skip=bool(options.get("skip_preprocess")), large=large)
        if per_channel:
            source = per_channel_opset(source, Path(scratch))
        batch_size, static = _calibration_batch_size(model, options)
        samples = usable
        if static:
            # A fixed-batch model cannot take a short last batch; calibrate on whole batches only.
            samples = usable - usable % batch_size
            if samples == 0:
                raise QuantizationError(f"the model takes batches of {batch_size}; the calibration set has only {usable} samples")
        # Both calibrators stream within the build memory budget (workers.quantize.streaming) and hand quantize_static
        # their ranges as its calibration cache: onnxruntime's own calibrators would hold samples x activations.
        if kiln_calibrator:
            cache_path, summary = _kiln_ranges(source, calibration_path, Path(scratch), method_key, options, samples)
        else:
            cache_path, summary = _ort_ranges(source, calibration_path, Path(scratch), method_key, options, samples, batch_size)
        try:
            quantize_static(
                str(source),
                str(out_path),
                None,
                quant_format=getattr(QuantFormat, QUANT_FORMATS[quant_format]),
                op_types_to_quantize=options.get("op_types_to_quantize"),
                per_channel=per_channel,
                reduce_range=reduce_range,
                activation_type=getattr(QuantType, _INTEGER_TYPES[activation_name]),
                weight_type=getattr(QuantType, _INTEGER_TYPES[weight_name]),
                nodes_to_exclude=nodes_to_exclude,
                use_external_data_format=large,
                calibrate_method=CalibrationMethod.MinMax if kiln_calibrator else getattr(CalibrationMethod, _CALIBRATION_METHODS[method_key]),
                extra_options={"WeightSymmetric": True, "ActivationSymmetric": activation_name == "int8",
                               "OpTypesToExcludeOutputQuantization": float_outputs},
                calibration_cache_path=cache_path,
            )
        except InvalidDataset as error:
            raise QuantizationError(f"calibration dataset unusable: {error}") from error
        except Exception as error:
            raise QuantizationError(f"static int8 quantization failed: {error}") from error
    recipe = {
        "method": "static",
        "quant_format": QUANT_FORMATS[quant_format],
        "calibration_method": _CALIBRATION_METHODS.get(method_key) or _KILN_ONLY_METHODS[method_key],
        "per_channel": per_channel,
        "weight_type": weight_name,
        "weight_symmetric": True,
        "activation_type": activation_name,
        "activation_symmetric": activation_name == "int8",
        "samples": summary["samples"],
        "calibration_streaming": summary["streaming"],
        "preprocess": preprocess,
        "nodes_excluded": nodes_to_exclude,
        "op_types": options.get("op_types_to_quantize") or "all supported",
    }
    if float_outputs:
        recipe["float_outputs"] = float_outputs
    if reduce_range:
        recipe["reduce_range"] = True
    if kiln_calibrator:
        recipe["calibrator"] = "kiln (streaming histograms)"
        recipe["range_rules"] = summary["rules"]
    else:
        recipe["calibrator"] = "onnxruntime's method, streamed"
    return recipe


def _build_int8_ort_defaults(model_path: Path, out_path: Path, *, calibration_path: str | Path, samples: int) -> dict[str, Any]:
    """onnxruntime's quantize_static exactly as a user calls it: every default, one sample per calibration batch.

    The vendor baseline Kiln's pick is compared with (benchmarks/quantization.py builds it the same
    way), so the search measures the very configuration a user gets without Kiln.
    """
    from onnxruntime.quantization import quantize_static

    from workers.quantize.calibration import NpzCalibrationReader

    model = load_graph_only(model_path)
    reader = NpzCalibrationReader(calibration_path, input_names=_feed_names(model), batch_size=1, limit=samples)
    try:
        # Scratch files (augmented models) go to a directory of this build's own, never a shared one.
        with tempfile.TemporaryDirectory(dir=out_path.parent, prefix=".int8-") as scratch, working_directory(scratch):
            quantize_static(str(model_path), str(out_path.resolve()), reader,
                            use_external_data_format=model_size_bytes(model_path) > LARGE_MODEL_BYTES)
    except InvalidDataset as error:
        raise QuantizationError(f"calibration dataset unusable: {error}") from error
    except Exception as error:
        raise QuantizationError(f"static int8 quantization (onnxruntime defaults) failed: {error}") from error
    return {"tool": "onnxruntime.quantization.quantize_static", "defaults": True, "quant_format": "QDQ",
            "calibration_method": "MinMax", "per_channel": False, "weight_type": "int8", "activation_type": "int8",
            "samples": reader.samples_read}


def _kiln_ranges(
    source: Path, calibration_path: str | Path, scratch: Path, method: str, options: dict[str, Any], samples: int
) -> tuple[Path, dict[str, Any]]:
    """Estimate ranges with Kiln's calibrator and write them where quantize_static reads a calibration cache."""
    from workers.quantize.calibration_methods import (
        DEFAULT_PERCENTILE,
        CalibrationError,
        calibrate,
        write_ort_calibration_cache,
    )

    try:
        result = calibrate(
            source, calibration_path, method=method, max_samples=samples,
            batch_size=int(options.get("calibration_batch_size", 16)),
            percentile=float(options.get("percentile", DEFAULT_PERCENTILE)),
        )
    except CalibrationError as error:
        raise QuantizationError(str(error)) from error
    return write_ort_calibration_cache(result, scratch / "ranges.json"), result.summary()


def _ort_ranges(source: Path, calibration_path: str | Path, scratch: Path, method: str, options: dict[str, Any], samples: int,
                batch_size: int) -> tuple[Path, dict[str, Any]]:
    """ONNX Runtime's calibration method, streamed (workers.quantize.ort_calibration), written as quantize_static's cache."""
    from workers.quantize.calibration_methods import CalibrationError
    from workers.quantize.ort_calibration import ort_ranges, write_ort_cache

    try:
        ranges, stream = ort_ranges(source, calibration_path, method=_CALIBRATION_METHODS[method], limit=samples,
                                    op_types=options.get("op_types_to_quantize"), batch_size=batch_size,
                                    what=f"int8 calibration ({method}, onnxruntime's method)")
    except CalibrationError as error:
        raise QuantizationError(str(error)) from error
    return write_ort_cache(ranges, scratch / "ranges.json"), {"samples": stream.samples_served, "streaming": dict(stream.plan)}


def _check_fp16_range(model_path: Path, calibration_path: str | Path) -> None:
    """Refuse FP16 when the FP32 model's activations on the calibration data exceed what FP16 can hold."""
    from workers.quantize.calibration_methods import CalibrationError, activation_absmax

    try:
        peaks = activation_absmax(model_path, calibration_path)
    except (CalibrationError, InvalidDataset) as error:
        raise QuantizationError(str(error)) from error
    overflowing = sorted(((peak, name) for name, peak in peaks.items() if peak > FP16_MAX), reverse=True)
    if overflowing:
        listed = ", ".join(f"{name!r} ({peak:.3g})" for peak, name in overflowing[:5])
        raise QuantizationError(
            f"fp16 would overflow: {len(overflowing)} activation(s) exceed the FP16 maximum {FP16_MAX:g} on the "
            f"calibration data, largest {listed}; keep the ops producing them in float (op_block_list) or use fp32/int8"
        )


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


def _build_int4_weight(
    model_path: Path, out_path: Path, *, options: dict[str, Any], calibration_path: str | Path | None = None, **_: Any
) -> dict[str, Any]:
    nodes_to_exclude = list(options.get("nodes_to_exclude") or [])
    graph = load_graph_only(model_path)
    converted_gemms: list[str] = []
    if options.get("gemm_to_matmul"):
        from workers.quantize.mixed import gemm_to_matmul

        graph, converted_gemms = gemm_to_matmul(graph)
    eligible = _matmuls_with_weights(graph, exclude=set(nodes_to_exclude))
    if not eligible:
        raise NotApplicable("int4-weight needs MatMul weights; this model has none")
    if options.get("tool", "onnxruntime") == "nncf":
        from workers.quantize.nncf_onnx import build_int4

        try:
            return build_int4(model_path, out_path, calibration_path=calibration_path, options=options)
        except ValueError as error:
            raise QuantizationError(str(error)) from error
        except Exception as error:
            raise QuantizationError(f"NNCF int4 weight compression failed: {error}") from error
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer  # noqa: F401
    except ImportError as error:
        # onnxruntime's quantizer imports onnx_ir, which onnxruntime does not declare as a dependency.
        raise QuantizationError(f"int4-weight needs the onnx-ir package: {error}") from error

    block_size = int(options.get("block_size", INT4_BLOCK_SIZE))
    symmetric = bool(options.get("symmetric", True))
    int8_nodes = list(options.get("int8_nodes") or [])
    try:
        from workers.quantize.mixed import gemm_to_matmul, quantize_matmul_weights

        model = onnx.load(str(model_path))
        if converted_gemms:
            model, _ = gemm_to_matmul(model)
        model, counts = quantize_matmul_weights(
            model, block_size=block_size, symmetric=symmetric, nodes_to_exclude=nodes_to_exclude, int8_nodes=int8_nodes,
        )
        quantized = counts["int4"] + counts["int8"]
        if not quantized:
            raise NotApplicable("int4-weight found no MatMul weight it could quantize in this model")
        save_model(model, out_path)
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
        **({"int8_nodes": int8_nodes, "int8_quantized_nodes": counts["int8"]} if int8_nodes else {}),
        **({"gemm_to_matmul": converted_gemms} if converted_gemms else {}),
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
