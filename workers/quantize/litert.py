"""LiteRT variants: the ONNX model converted to a `.tflite` flatbuffer (FP32, FP16 weights, or full-integer INT8).

onnx2tf turns the ONNX graph into a Keras model (channels-last inside, as LiteRT's kernels want);
TensorFlow's TFLiteConverter turns that into the flatbuffer. Around the Keras model Kiln puts a
signature with the ONNX model's own input and output names, inputs in the ONNX layout (onnx2tf keeps
them NCHW and transposes inside) and each output transposed back to the ONNX layout, so the agent,
the report and a package's `run.py` feed and read a LiteRT variant exactly like the ONNX ones.

- `fp32`: float32 throughout.
- `fp16`: float16 weights (half the size); LiteRT's XNNPACK computes in float32 on CPUs without
  float16 arithmetic and may use float16 where the CPU has it.
- `int8`: full-integer quantization calibrated on the job's calibration set: every operator runs on
  int8 (`TFLITE_BUILTINS_INT8`; a model with an operator that has no int8 kernel is refused, naming
  it), with per-channel weights, and float32 in and out (one quantize at the input, one dequantize at
  each output), so callers keep feeding float32.

LiteRT models have fixed shapes: dynamic dimensions are fixed to the calibration data's shapes at
batch 1 (or the model's own batch when it fixes one). The FP32 build is checked against ONNX
Runtime on the first samples: a conversion that does not reproduce the ONNX model is refused, not
measured. The converter (TensorFlow, onnx2tf) is the worker's optional extra `kiln[litert]`; the
agent needs only `ai-edge-litert`.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import os
import re
import tempfile
import time
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from devices.artifacts import TFLITE, artifact_format
from kiln_contract.metrics import relative_l2
from workers.datasets import InvalidDataset, dataset_samples, iter_batches
from workers.inspect import load_graph_only

logger = logging.getLogger(__name__)

RUNTIME = "litert"
PRECISIONS = ("fp32", "fp16", "int8")
OPTIONS = {"runtime", "max_calibration_samples"}
CHECK_SAMPLES = 4
# An FP32 conversion that is off by more than this (relative L2 against ONNX Runtime) is a conversion fault.
FP32_CONVERSION_TOLERANCE = 1e-3
# Fewer samples than this give activation ranges that are mostly noise (as for ONNX INT8).
MIN_CALIBRATION_SAMPLES = 8
# Operators LiteRT has no kernel for that onnx2tf can write with built-in ones instead (its "pseudo" operators):
# the TensorFlow name the converter reports, and onnx2tf's name for the replacement.
PSEUDO_OPERATORS = {"Erf": "erf", "Asin": "asin", "Acos": "acos", "Atan": "atan"}
EXTRA_HINT = "pip install 'kiln[litert]' on the worker (TensorFlow, tf-keras, onnx2tf)"


class ConversionError(Exception):
    """The model could not be made into a LiteRT flatbuffer; the message says why in a user's words."""


class UnsupportedOperators(ConversionError):
    """LiteRT has no built-in kernel for these TensorFlow operators (`operators`)."""

    def __init__(self, message: str, operators: list[str]):
        super().__init__(message)
        self.operators = operators


def toolchain() -> dict[str, str]:
    """Versions of the converter's parts that are installed."""
    found = {}
    for name in ("tensorflow", "tf-keras", "onnx2tf", "ai-edge-litert"):
        with contextlib.suppress(PackageNotFoundError):
            found[name] = version(name)
    return found


def converter_available() -> bool:
    """Whether this host can convert to LiteRT (the `litert` extra is installed)."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("tensorflow", "tf_keras", "onnx2tf", "ai_edge_litert"))


def build_litert(model_path: Path, out_path: Path, *, precision: str, calibration_path: str | Path | None,
                 options: dict[str, Any]) -> dict[str, Any]:
    """Convert `model_path` to a LiteRT flatbuffer at `out_path`; return the recipe. Raises ConversionError."""
    if precision not in PRECISIONS:
        raise ConversionError(f"LiteRT variants are {', '.join(PRECISIONS)}; {precision} has no LiteRT form")
    started = time.perf_counter()
    graph = load_graph_only(model_path).graph
    inputs = _graph_inputs(graph)
    samples = _calibration_samples(calibration_path, inputs, precision, options)
    shapes = _fixed_shapes(inputs, samples)
    check_feeds = samples[:CHECK_SAMPLES] or [_synthetic_feeds(inputs, shapes)]
    reference = _onnx_outputs(model_path, check_feeds)
    output_names = [value.name for value in graph.output]
    with tempfile.TemporaryDirectory(prefix="kiln-litert-") as scratch:
        static_path, specialised = _static_onnx(model_path, shapes, Path(scratch))
        blob, layouts, pseudo, converted_s = _convert(static_path, inputs, shapes, output_names, check_feeds[0], reference[0],
                                                      precision, samples)
    Path(out_path).write_bytes(blob)
    check = _check_against_onnx(out_path, check_feeds, reference, output_names)
    if precision == "fp32" and check["worst_relative_l2"] > FP32_CONVERSION_TOLERANCE:
        Path(out_path).unlink(missing_ok=True)
        raise ConversionError(f"the LiteRT conversion does not reproduce the ONNX model: output {check['worst_output']!r} is "
                              f"off by {check['worst_relative_l2']:.3g} (relative L2) at FP32")
    return {
        "runtime": RUNTIME,
        "format": TFLITE,
        "method": {"fp32": "float32", "fp16": "float16 weights", "int8": "full integer (TFLITE_BUILTINS_INT8)"}[precision],
        "tool": "onnx2tf + TFLiteConverter",
        "toolchain": toolchain(),
        "input_shapes": {name: list(dims) for name, dims in shapes.items()},
        "layout": "inputs and outputs as in the ONNX model (NCHW kept; channels-last inside)",
        "static_onnx": specialised,
        **({"pseudo_operators": pseudo} if pseudo else {}),
        "output_transposes": {name: list(perm) for name, perm in zip(output_names, layouts) if perm != tuple(range(len(perm)))},
        **({"samples": len(samples), "per_channel": True, "activation_type": "int8", "weight_type": "int8",
            "io": "float32 (quantized inside)"} if precision == "int8" else {}),
        "conversion_check": check,
        "convert_s": round(time.perf_counter() - started, 2),
        "onnx2tf_s": round(converted_s, 2),
    }


# -- what the model takes ----------------------------------------------------------------------

def _graph_inputs(graph) -> list[tuple[str, np.dtype, list[int | None]]]:
    """(name, dtype, dims with None for dynamic) of each real input, in the ONNX order."""
    from onnx import helper

    initializers = {tensor.name for tensor in graph.initializer}
    found = []
    for value in graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dims = [dim.dim_value if dim.HasField("dim_value") and dim.dim_value > 0 else None for dim in tensor.shape.dim]
        found.append((value.name, np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)), dims))
    return found


def _calibration_samples(calibration_path, inputs, precision: str, options: dict[str, Any]) -> list[dict[str, np.ndarray]]:
    """Calibration samples one at a time (`{name: array}` with their batch axis); all of them for INT8, a few otherwise."""
    if calibration_path is None:
        if precision == "int8":
            raise ConversionError("LiteRT int8 needs a calibration dataset")
        return []
    limit = options.get("max_calibration_samples") if precision == "int8" else CHECK_SAMPLES
    names = [name for name, _, _ in inputs]
    try:
        if precision == "int8" and min(dataset_samples(calibration_path), limit or 1 << 30) < MIN_CALIBRATION_SAMPLES:
            raise ConversionError(f"the calibration set has fewer than {MIN_CALIBRATION_SAMPLES} samples; "
                                  "LiteRT int8 needs them to estimate activation ranges")
        batches = iter_batches(calibration_path, input_names=names, batch_size=1, limit=limit)
        return [{name: np.asarray(batch[name]) for name in names} for batch in batches]
    except InvalidDataset as error:
        raise ConversionError(f"calibration dataset unusable: {error}") from error


def _fixed_shapes(inputs, samples: list[dict[str, np.ndarray]]) -> dict[str, tuple[int, ...]]:
    """Each input's shape in the flatbuffer: the model's, its dynamic dimensions fixed by the data (batch 1 when unknown)."""
    shapes = {}
    for name, _, dims in inputs:
        data = samples[0][name].shape if samples else None
        if data is not None and len(data) != len(dims):
            raise ConversionError(f"the calibration data's {name!r} has shape {list(data)}; the model takes {len(dims)} dimensions")
        fixed = []
        for axis, dim in enumerate(dims):
            if dim is not None:
                fixed.append(dim)
            elif data is not None:
                fixed.append(int(data[axis]))
            elif axis == 0:
                fixed.append(1)
            else:
                raise ConversionError(f"LiteRT models have fixed shapes: input {name!r} has a dynamic dimension {axis} "
                                      "and the job has no calibration data to fix it")
        shapes[name] = tuple(fixed)
    return shapes


def _synthetic_feeds(inputs, shapes) -> dict[str, np.ndarray]:
    """Seeded inputs for the conversion check when the job gives no data (floats ~N(0, 1), integers 0)."""
    rng = np.random.default_rng(0)
    return {name: (rng.standard_normal(shapes[name]) if np.issubdtype(dtype, np.floating) else np.zeros(shapes[name])).astype(dtype)
            for name, dtype, _ in inputs}


def _onnx_outputs(model_path: Path, feeds_list: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    return [session.run(None, feeds) for feeds in feeds_list]


# -- the conversion --------------------------------------------------------------------------

def _static_onnx(model_path: Path, shapes: dict[str, tuple[int, ...]], scratch: Path) -> tuple[Path, str]:
    """The graph with its inputs fixed to `shapes` and every shape computation folded (onnxslim), which onnx2tf
    converts far more reliably than symbolic shapes; the model as it is when that fails."""
    import onnx
    import onnxslim

    try:
        slimmed = onnxslim.slim(str(model_path), input_shapes=[f"{name}:{','.join(map(str, dims))}" for name, dims in shapes.items()],
                                model_check=False)
        if slimmed is None:
            return model_path, "kept as is: onnxslim returned no model"
        static_path = scratch / "static.onnx"
        onnx.save(slimmed, str(static_path))
    except Exception as error:
        logger.info("fixing the input shapes with onnxslim failed: %s", error)
        return model_path, f"kept as is: {type(error).__name__}: {str(error)[:200]}"
    return static_path, "inputs fixed and shape computations folded (onnxslim)"


def _import_converter():
    """TensorFlow and onnx2tf, quiet; ConversionError naming the extra when they are missing."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        import onnx2tf
        import tensorflow as tf
    except ImportError as error:
        raise ConversionError(f"the LiteRT converter is not installed on this worker ({error}); {EXTRA_HINT}") from error
    tf.get_logger().setLevel(logging.ERROR)
    return tf, onnx2tf


def _convert(static_path: Path, inputs, shapes, output_names: list[str], feeds: dict[str, np.ndarray], reference: list[np.ndarray],
             precision: str, samples) -> tuple[bytes, list[tuple[int, ...]], list[str], float]:
    """(flatbuffer, output transposes, pseudo operators used, onnx2tf seconds): once as is, and once more with onnx2tf's
    built-in replacements when LiteRT lacks a kernel only for operators that have one (GELU's Erf, most often)."""
    pseudo: list[str] = []
    while True:
        keras_model, converted_s = _to_keras(static_path, inputs, shapes, pseudo)
        layouts = _output_layouts(keras_model, feeds, reference, output_names, inputs)
        try:
            return _to_tflite(keras_model, inputs, shapes, output_names, layouts, precision, samples), layouts, pseudo, converted_s
        except UnsupportedOperators as error:
            replaceable = sorted({op for op in error.operators if op in PSEUDO_OPERATORS})
            if pseudo or not replaceable or len(replaceable) < len(set(error.operators)):
                raise
            logger.info("LiteRT lacks %s; converting again with onnx2tf's built-in replacements", replaceable)
            pseudo = replaceable


def _to_keras(model_path: Path, inputs, shapes, pseudo: list[str]) -> tuple[Any, float]:
    """onnx2tf's Keras model of the graph at the fixed shapes, its inputs kept in the ONNX layout."""
    _, onnx2tf = _import_converter()
    started = time.perf_counter()
    channels_first = [name for name, _, dims in inputs if 3 <= len(dims) <= 5]
    said = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="kiln-onnx2tf-") as scratch, contextlib.redirect_stdout(said):
        try:
            model = onnx2tf.convert(
                input_onnx_file_path=str(model_path), output_folder_path=scratch, disable_model_save=True, non_verbose=True,
                # Kiln's convert stage already simplified the graph (onnxslim); onnxsim is not installed.
                not_use_onnxsim=True,
                keep_ncw_or_nchw_or_ncdhw_input_names=channels_first or None,
                overwrite_input_shape=[f"{name}:{','.join(map(str, shape))}" for name, shape in shapes.items()],
                replace_to_pseudo_operators=[PSEUDO_OPERATORS[op] for op in pseudo] or None,
            )
        except (Exception, SystemExit) as error:
            raise ConversionError(f"onnx2tf could not convert the model: {_first_error(str(error) or said.getvalue())}") from None
    if model is None:
        raise ConversionError(f"onnx2tf could not convert the model: {_first_error(said.getvalue())}")
    return model, time.perf_counter() - started


def _first_error(text: str) -> str:
    """The lines of a converter's output that say what went wrong (no ANSI colours, no MLIR dumps), at most 600 characters."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    lines = [line.strip() for line in plain.splitlines() if line.strip() and not line.lstrip().startswith(("%", "loc(", "^"))]
    wanted = [line for line in lines if re.search(r"error|not supported|unsupported|failed", line, re.IGNORECASE)]
    return " ".join(wanted or lines[-3:])[:600] or "no message"


def _output_layouts(keras_model, feeds: dict[str, np.ndarray], reference: list[np.ndarray], output_names: list[str],
                    inputs) -> list[tuple[int, ...]]:
    """Per ONNX output, the transpose that takes the Keras output back to the ONNX layout (found on real values)."""
    try:
        produced = keras_model([feeds[name].astype(dtype) for name, dtype, _ in inputs], training=False)
    except Exception as error:
        raise ConversionError(f"onnx2tf's model of the graph does not run: {_first_error(str(error))}") from None
    produced = [np.asarray(value) for value in (produced if isinstance(produced, list | tuple) else [produced])]
    if len(produced) != len(output_names):
        raise ConversionError(f"onnx2tf made {len(produced)} outputs of the model's {len(output_names)}")
    return [_best_transpose(value, expected, name) for value, expected, name in zip(produced, reference, output_names)]


def _best_transpose(value: np.ndarray, expected: np.ndarray, name: str) -> tuple[int, ...]:
    identity = tuple(range(value.ndim))
    candidates = [perm for perm in itertools.permutations(identity) if value.transpose(perm).shape == expected.shape]
    if not candidates:
        raise ConversionError(f"output {name!r}: onnx2tf made shape {list(value.shape)}, the ONNX model {list(expected.shape)}")
    # The identity first: where two layouts fit the shape equally (square maps), the values decide.
    candidates.sort(key=lambda perm: perm != identity)
    return min(candidates, key=lambda perm: float(np.abs(value.transpose(perm).astype(np.float64) - expected).max(initial=0.0)))


def _to_tflite(keras_model, inputs, shapes, output_names: list[str], layouts, precision: str,
               samples: list[dict[str, np.ndarray]]) -> bytes:
    """The flatbuffer, with one signature named after the ONNX inputs and outputs."""
    tf, _ = _import_converter()
    spec = [tf.TensorSpec(shapes[name], tf.as_dtype(dtype), name=name) for name, dtype, _ in inputs]

    @tf.function(input_signature=spec)
    def serve(*tensors):
        produced = keras_model(list(tensors), training=False)
        produced = produced if isinstance(produced, list | tuple) else [produced]
        return {name: tf.transpose(value, perm) if perm != tuple(range(len(perm))) else value
                for name, value, perm in zip(output_names, produced, layouts)}

    holder = tf.Module()
    holder.serve = serve
    converter = tf.lite.TFLiteConverter.from_concrete_functions([serve.get_concrete_function()], holder)
    if precision == "fp16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    elif precision == "int8":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: _representative(samples, inputs)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    try:
        return converter.convert()
    except Exception as error:
        raise _refusal(str(error), precision) from None


def _representative(samples: list[dict[str, np.ndarray]], inputs) -> Iterator[list[np.ndarray]]:
    for sample in samples:
        yield [np.ascontiguousarray(sample[name], dtype=dtype) for name, dtype, _ in inputs]


def _refusal(text: str, precision: str) -> ConversionError:
    """The converter's refusal in a user's words: which operators LiteRT has no (int8) kernel for."""
    select = re.search(r"TF Select ops: ([^\n]+)", text)
    if select:
        operators = [op.strip() for op in select.group(1).split(",") if op.strip()]
        return UnsupportedOperators(f"LiteRT has no built-in kernel for {', '.join(operators)} "
                                    "(it would need TensorFlow's kernels, which a device's LiteRT lacks)", operators)
    quantizable = re.findall(r"'(tfl\.[a-z_0-9]+)' op is neither", text) + re.findall(r"Quantization not yet supported for op: '?([A-Z_0-9]+)", text)
    if quantizable and precision == "int8":
        return ConversionError(f"LiteRT has no int8 kernel for {', '.join(sorted(set(quantizable)))}; full-integer int8 cannot run this model")
    return ConversionError(f"the TFLite converter failed: {_first_error(text)}")


# -- checking the result -----------------------------------------------------------------------

def _check_against_onnx(tflite_path: Path, feeds_list: list[dict[str, np.ndarray]], reference: list[list[np.ndarray]],
                        output_names: list[str]) -> dict[str, Any]:
    """The flatbuffer run by LiteRT on the check samples against ONNX Runtime: the worst relative L2 per output."""
    from devices.backends.litert import LiteRtCompiledModel

    if artifact_format(tflite_path) != TFLITE:
        raise ConversionError("the converter wrote something that is not a LiteRT flatbuffer")
    compiled = LiteRtCompiledModel(Path(tflite_path), threads=1)
    try:
        errors: dict[str, float] = {}
        for feeds, expected in zip(feeds_list, reference):
            try:
                produced = compiled.run(feeds)
            except Exception as error:
                # Full-integer kernels refuse some inputs at run time (an int8 Div whose divisor quantizes to zero).
                raise ConversionError(f"LiteRT cannot run the converted model: {_first_error(str(error)) or type(error).__name__}") from None
            for name, value in zip(output_names, expected):
                error = relative_l2(produced[name], value)
                errors[name] = max(errors.get(name, 0.0), error)
    finally:
        compiled.close()
    worst = max(errors, key=errors.get) if errors else None
    return {"samples": len(feeds_list), "relative_l2": {name: round(value, 6) for name, value in errors.items()},
            "worst_output": worst, "worst_relative_l2": errors.get(worst, 0.0) if worst else 0.0, "against": "onnxruntime fp32"}

