"""Learned INT8 variants: calibrate as usual, then learn the weights' rounding (per layer: AdaRound; per block of layers:
BRECQ) or fine-tune them (QAT) on the calibration set.

`build_learned_int8` is what `workers.quantize.variants` calls for an int8 spec with `learn`. For
ONNX Runtime the result is the calibrated variant's own QDQ graph with learned integer weights: the
same operators, scales and speed, so agents run it like any other INT8 variant. For OpenVINO
(`runtime: openvino`) it is NNCF's IR of the FP32 model with the learned weights on NNCF's grid
(`workers.learned.openvino`): OpenVINO's own pipeline, carrying the learned rounding. Time and memory are bounded: the
whole learning stops at `learn_seconds`, and the activations kept for it at `learn_memory_mb`.
"""
from __future__ import annotations

import math
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from workers.convert import LARGE_MODEL_BYTES
from workers.inspect import model_size_bytes
from workers.learned.options import LEARN_OPTIONS
from workers.quantize.nncf_openvino import RUNTIME as OPENVINO
from workers.quantize.preprocess import per_channel_opset, preprocess_for_quantization

from .brecq import BLOCK_LAYERS, block_nearest_error, find_blocks, learn_block, single_blocks
from .layers import (
    TensorReader,
    find_layers,
    fp32_weights,
    gather_tensors,
    quantized_activations,
    quantized_initializers,
    replace_integer_weights,
    write_tuned_weights,
)
from .openvino import (
    GRID_CALIBRATION,
    NNCF_OPTIONS,
    align_input_ranges,
    ir_output_error,
    ir_weight_agreement,
    nncf_input_ranges,
    on_grid_weights,
    on_nncf_grid,
    write_float_weights,
)
from .qat import LEARNING_RATE, build_student, distill, distillation_targets, export_weights
from .torch_graph import UnsupportedGraph

METHODS = ("adaround", "brecq", "qat")
DEFAULT_SECONDS = 120
DEFAULT_MEMORY_MB = 512
DEFAULT_SAMPLES = 256
MAX_STEPS_PER_LAYER = 3000  # a block of layers learned together (BRECQ): as many per layer it holds
# Runs of blocks (AdaRound: one layer each) learned in graph order, each fed by a pass of the quantized graph (one layer a run where that many
# passes take at most GATHER_SHARE of the budget; fewer, longer runs when they would take more).
ORDER_RUNS = 256
GATHER_SHARE = 0.5


class LearningNotApplicable(Exception):
    """Nothing here can be learned (no quantized weight layer); the message says why."""


def split_options(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(calibration options, learning options) of an int8 spec."""
    return ({k: v for k, v in options.items() if k not in LEARN_OPTIONS}, {k: v for k, v in options.items() if k in LEARN_OPTIONS})


def _calibration_batches(model_path: Path, calibration_path: Path, samples: int) -> list[dict[str, np.ndarray]]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    static = next((i.shape[0] for i in session.get_inputs() if i.shape and isinstance(i.shape[0], int) and i.shape[0] > 0), None)
    with np.load(calibration_path, allow_pickle=False) as archive:
        arrays = {name: archive[name][:samples] for name in names}
    rows = len(next(iter(arrays.values())))
    step = static or 16
    batches = []
    for start in range(0, rows - (rows % step if static else 0), step):
        batches.append({name: value[start:start + step] for name, value in arrays.items()})
    return batches or [arrays]


def _tensor_bytes(quantized: TensorReader, fp32: TensorReader, layers, probe: list[dict[str, np.ndarray]]) -> tuple[dict[str, int], dict[str, int]]:
    """Bytes per sample of each block's input (as the QDQ graph computes it) and of its output (FP32), keyed by block node."""
    inputs = quantized.read(sorted({layer.quantized_input_name for layer in layers}), probe)
    outputs = fp32.read(sorted({layer.output_name for layer in layers}), probe)
    return ({layer.node: inputs[layer.quantized_input_name][:1].nbytes for layer in layers},
            {layer.node: outputs[layer.output_name][:1].nbytes for layer in layers})


def _chunks(layers, sizes: dict[str, int], *, count: int, bound: int) -> list[list]:
    """The blocks, in graph order, in about `count` runs of equal length, each run split again where its tensors
    (`sizes`, bytes for all samples) would exceed `bound`."""
    length = max(1, math.ceil(len(layers) / max(1, count)))
    chunks = []
    for start in range(0, len(layers), length):
        current, held = [], 0
        for layer in layers[start:start + length]:
            if current and held + sizes[layer.node] > bound:
                chunks.append(current)
                current, held = [], 0
            current.append(layer)
            held += sizes[layer.node]
        chunks.append(current)
    return chunks


def _learn_in_graph_order(model_path: Path, qdq: onnx.ModelProto, blocks, weights, calibration_path: Path, *, wanted: int, memory_mb: int,
                          budget: float, started: float, results: list, learned: dict) -> dict[str, Any]:
    """Learned rounding run by run of blocks (brecq.Block; AdaRound's are one layer each) in graph order. A run's inputs are
    what the QDQ graph computes with every block before it already learned, its targets FP32's outputs, so each block also
    makes up for the error of the quantized layers above it (the asymmetric reconstruction of AdaRound and BRECQ). A run is
    one block where the budget affords a pass over the data per block, several where it does not. One run's inputs are held at a time (and FP32's targets of
    every layer, when half the memory bound holds them). If the learned
    graph's outputs end further from FP32's than the calibrated graph's, the calibrated integers are kept."""
    outputs = [output.name for output in qdq.graph.output]
    layers = [layer for block in blocks for layer in block.layers]
    integer_names = {layer.quantized_weight_name for layer in layers}
    calibrated_integers = {tensor.name: numpy_helper.to_array(tensor) for tensor in qdq.graph.initializer if tensor.name in integer_names}
    quantized_reader = TensorReader(qdq, sorted({block.quantized_input_name for block in blocks} | set(outputs)), overridable=sorted(integer_names))
    fp32_reader = TensorReader(model_path, sorted({block.output_name for block in blocks} | set(outputs)))
    input_bytes, output_bytes = _tensor_bytes(quantized_reader, fp32_reader, blocks, _calibration_batches(model_path, calibration_path, 1)[:1])
    bound = memory_mb << 20
    samples = max(1, min(wanted, bound // max(input_bytes[node] + output_bytes[node] for node in input_bytes)))
    batches = _calibration_batches(model_path, calibration_path, samples)
    samples = sum(len(next(iter(batch.values()))) for batch in batches)
    sizes = {node: (input_bytes[node] + output_bytes[node]) * samples for node in input_bytes}
    reference = fp32_reader.read(outputs, batches)
    # FP32's targets do not change as layers are learned: read them all in one pass when half the bound holds them.
    every_target = (fp32_reader.read(sorted({block.output_name for block in blocks}), batches)
                    if sum(output_bytes.values()) * samples <= bound // 2 else None)
    calibrated_error = _output_error(quantized_reader.read(outputs, batches), reference)
    if every_target is not None:
        bound -= sum(output_bytes.values()) * samples
        sizes = {node: input_bytes[node] * samples for node in input_bytes}
    pending = _chunks(blocks, sizes, count=ORDER_RUNS, bound=bound)
    runs = 0
    while pending:
        chunk, gathering = pending.pop(0), time.perf_counter()
        inputs = quantized_reader.read(sorted({block.quantized_input_name for block in chunk}), batches, overrides=_integers(learned, calibrated_integers))
        targets = every_target if every_target is not None else fp32_reader.read(sorted({block.output_name for block in chunk}), batches)
        runs += 1
        # Gathering costs a pass over the data each run: fewer, longer runs when passes would eat the learning time.
        remaining = budget - (time.perf_counter() - started)
        affordable = max(1, int(GATHER_SHARE * remaining / max(time.perf_counter() - gathering, 1e-3)))
        rest = [block for run in pending for block in run]
        if rest and affordable < len(pending):
            pending = _chunks(rest, sizes, count=affordable, bound=bound)
        share = remaining * _layer_count(chunk) / (_layer_count(chunk) + _layer_count(rest))
        _learn_blocks(chunk, weights, inputs, targets, budget=share, started=time.perf_counter(), results=results, learned=learned)
    learned_error = _output_error(quantized_reader.read(outputs, batches, overrides=_integers(learned, calibrated_integers)), reference)
    kept = "learned" if learned_error <= calibrated_error else "calibrated"
    if kept == "calibrated":
        learned.update(calibrated_integers)
    return {"samples": samples, "runs": runs, "output_error_calibrated": round(calibrated_error, 6),
            "output_error_learned": round(learned_error, 6), "kept": kept}


def _integers(learned: dict[str, np.ndarray], calibrated: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The integer weights as the graph holds them (dtype and shape), learned where learned so far."""
    return {name: np.asarray(learned.get(name, value)).astype(value.dtype).reshape(value.shape) for name, value in calibrated.items()}


def _output_error(values: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> float:
    """The outputs' squared error relative to FP32's energy, summed over outputs."""
    return float(sum(np.mean((values[name] - target) ** 2) / max(float(np.mean(target ** 2)), 1e-20) for name, target in reference.items()))


def _layer_count(blocks) -> int:
    return sum(len(block.layers) for block in blocks)


def _learn_blocks(blocks, weights, inputs, targets, *, budget: float, started: float, results: list, learned: dict) -> None:
    """Each block's share of what is left of the budget follows its error when rounded to nearest (plus a floor)."""
    def arguments(block):
        return {"weights": weights, "inputs": inputs[block.quantized_input_name], "targets": targets[block.output_name]}

    errors = [block_nearest_error(block, **arguments(block)) for block in blocks]
    shares = [error + 0.1 * sum(errors) / len(errors) for error in errors]
    for index, block in enumerate(blocks):
        remaining = budget - (time.perf_counter() - started)
        seconds = max(0.0, remaining * shares[index] / max(sum(shares[index:]), 1e-20))
        result = learn_block(block, **arguments(block), seconds=seconds, max_steps=MAX_STEPS_PER_LAYER * len(block.layers), seed=len(results))
        for layer, integers in zip(block.layers, result.integers, strict=True):
            learned[layer.quantized_weight_name] = integers
        results.append({**result.summary(), **({"block": [layer.node for layer in block.layers]} if block.graph is not None else {})})


def build_learned_int8(model_path: Path, out_path: Path, *, calibration_path, options: dict[str, Any], base_builder,
                       calibrator=None) -> dict[str, Any]:
    """Calibrated INT8 with `base_builder`, then learned rounding of every quantized weight layer, built for the spec's
    runtime: into ONNX Runtime's QDQ graph, or (`runtime: openvino`) handed to NNCF's OpenVINO pipeline as on-grid float
    weights, learned on a QDQ graph that `calibrator` (ONNX Runtime's static INT8 builder) calibrates on NNCF's grid."""
    calibration_options, learn = split_options(options)
    method = learn.get("learn")
    if method not in METHODS:
        raise ValueError(f"unknown learning method {method!r}; choose {', '.join(METHODS)}")
    for_openvino = calibration_options.get("runtime") == OPENVINO
    if not for_openvino and calibration_options.get("tool", "onnxruntime") != "onnxruntime":
        raise LearningNotApplicable("learned rounding works on ONNX Runtime's QDQ graphs and OpenVINO's NNCF IR only")
    if for_openvino and calibrator is None:
        raise ValueError("a learned OpenVINO build needs ONNX Runtime's static INT8 builder to learn on")
    started = time.perf_counter()
    budget = float(learn.get("learn_seconds", DEFAULT_SECONDS))
    with tempfile.TemporaryDirectory(prefix="kiln-learn-") as scratch:
        # Learn against the very graph the quantizer quantized: ORT's pre-processing folds BatchNormalization into the
        # convolutions, whose folded weights are then the ones quantized (and the only ones worth learning).
        source, preprocess = preprocess_for_quantization(Path(model_path), Path(scratch), skip=bool(calibration_options.get("skip_preprocess")),
                                                         large=model_size_bytes(Path(model_path)) > LARGE_MODEL_BYTES)
        calibrated = Path(scratch) / "calibrated.onnx"
        # The teacher and the calibrated graph at one opset (the per-channel calibrations raise an older one to 13).
        source = per_channel_opset(source, Path(scratch))
        if for_openvino:
            recipe = calibrator(source, calibrated, calibration_path=calibration_path, options={**GRID_CALIBRATION, "skip_preprocess": True})
        else:
            recipe = base_builder(source, calibrated, calibration_path=calibration_path, options={**calibration_options, "skip_preprocess": True})
        recipe = {**recipe, "preprocess": preprocess}
        qdq, fp32 = onnx.load(str(calibrated)), onnx.load(str(source))
        if not for_openvino:
            return _learn(source, out_path, qdq=qdq, fp32=fp32, recipe=recipe, method=method, learn=learn,
                          calibration_path=Path(calibration_path), budget=budget, started=started)
        nncf = _nncf_reference(source, qdq, fp32, calibration_path=calibration_path, options={**calibration_options, **NNCF_OPTIONS},
                               base_builder=base_builder, scratch=Path(scratch))
        learned_qdq = Path(scratch) / "learned.onnx"
        # NNCF's reference IR is OpenVINO's own build, not learning: the budget counts from here.
        built = _learn(source, learned_qdq, qdq=qdq, fp32=fp32, recipe=recipe, method=method, learn=learn,
                       calibration_path=Path(calibration_path), budget=budget, started=time.perf_counter())
        return _hand_to_openvino(source, learned_qdq, out_path, nncf=nncf, learned=built["learned"], calibration_path=calibration_path,
                                 options={**calibration_options, **NNCF_OPTIONS}, base_builder=base_builder, scratch=Path(scratch))


def _nncf_reference(source: Path, qdq: onnx.ModelProto, fp32: onnx.ModelProto, *, calibration_path, options: dict[str, Any], base_builder,
                    scratch: Path) -> dict[str, Any]:
    """NNCF's own IR of the FP32 model, and what learning takes from it: the layers it quantizes on the learning's grid
    (`gridded`), and their inputs' ranges, written into `qdq` so that learning sees the activation error OpenVINO will have."""
    plain = scratch / "nncf.openvino.tar"
    base_builder(source, plain, calibration_path=calibration_path, options=options)
    layers = [layer for layer in find_layers(qdq, fp32) if layer.skipped is None]
    nearest, _ = on_grid_weights(qdq, layers)
    gridded = on_nncf_grid(plain, nearest)
    aligned = align_input_ranges(qdq, layers, nncf_input_ranges(plain, {name: nearest[name] for name in gridded}))
    return {"path": plain, "gridded": gridded, "learnable": set(nearest), "aligned": aligned}


def _hand_to_openvino(source: Path, learned_qdq: Path, out_path: Path, *, nncf: dict[str, Any], learned: dict[str, Any], calibration_path,
                      options: dict[str, Any], base_builder, scratch: Path) -> dict[str, Any]:
    """NNCF's OpenVINO IR of the FP32 model whose learned layers' weights are the learned integers x their scales (on NNCF's
    weight grid, so NNCF's own quantization keeps them), for the layers NNCF quantizes on that grid; NNCF's own IR of the
    FP32 model instead when that one's outputs are closer to FP32's. The recipe says how many of the IR's weights are
    the learned ones, and which IR was kept."""
    fp32, qdq = onnx.load(str(source)), onnx.load(str(learned_qdq))
    layers = [layer for layer in find_layers(qdq, fp32) if layer.skipped is None]
    weights, pinned = on_grid_weights(qdq, layers)
    weights = {name: value for name, value in weights.items() if name in nncf["gridded"]}
    # QAT also tunes the weights the QDQ graph keeps in float: they go to NNCF as trained.
    floats = fp32_weights(qdq, sorted(_float_weights(qdq, [tensor.name for tensor in fp32.graph.initializer]) - nncf["learnable"]))
    on_grid = scratch / "on-grid.onnx"
    write_float_weights(source, {**floats, **weights}, on_grid)
    recipe = base_builder(on_grid, out_path, calibration_path=calibration_path, options=options)
    batches = _calibration_batches(source, Path(calibration_path), DEFAULT_SAMPLES)
    reference = gather_tensors(source, [output.name for output in fp32.graph.output], batches)
    errors = {"nncf": ir_output_error(nncf["path"], batches, reference), "learned": ir_output_error(out_path, batches, reference)}
    kept = "learned" if errors["learned"] <= errors["nncf"] else "nncf"
    agreement = ir_weight_agreement(out_path, weights)
    if kept == "nncf":
        shutil.copyfile(nncf["path"], out_path)
    written = {"runtime": OPENVINO, "written": "as float weights on NNCF's OpenVINO grid (per channel max|w|/127), quantized by NNCF",
               "learned_on": GRID_CALIBRATION, "layers_on_nncf_grid": len(nncf["gridded"]), "input_ranges_from_nncf": nncf["aligned"],
               "channels_pinned": pinned, "ir_weights_learned": agreement, "ir_output_error_nncf": round(errors["nncf"], 6),
               "ir_output_error_learned": round(errors["learned"], 6), "ir_kept": kept}
    return {**recipe, "learned": {**learned, **written}}


def _learn(model_path: Path, out_path: Path, *, qdq, fp32, recipe: dict, method: str, learn: dict, calibration_path: Path, budget: float,
           started: float) -> dict[str, Any]:
    """Learned rounding (per layer, or per block for BRECQ) or QAT of the calibrated graph `qdq` against `model_path` (the
    FP32 graph it was quantized from)."""
    layers = find_layers(qdq, fp32)
    usable = [layer for layer in layers if layer.skipped is None]
    if not usable:
        reasons = "; ".join(f"{layer.node}: {layer.skipped}" for layer in layers) or "no Conv, Gemm or MatMul has a quantized weight"
        raise LearningNotApplicable(f"nothing to learn ({reasons})")
    if method == "qat":
        return _build_qat(model_path, out_path, fp32=fp32, qdq=qdq, recipe=recipe, layers=layers, calibration_path=calibration_path, learn=learn,
                          budget=budget, started=started)
    weights = fp32_weights(fp32, [layer.weight_name for layer in usable] + [layer.bias_name for layer in usable if layer.bias_name])
    blocks = (find_blocks(fp32, usable, activations=quantized_activations(qdq, fp32), fixed=quantized_initializers(qdq, fp32))
              if method == "brecq" else single_blocks(usable))
    results, learned = [], {}
    # One intra-op thread: the layers are small, and more threads only contend with the worker's other tasks.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        order = _learn_in_graph_order(model_path, qdq, blocks, weights, calibration_path, wanted=int(learn.get("learn_samples", DEFAULT_SAMPLES)),
                                      memory_mb=int(learn.get("learn_memory_mb", DEFAULT_MEMORY_MB)), budget=budget, started=started,
                                      results=results, learned=learned)
    finally:
        torch.set_num_threads(threads)
    replace_integer_weights(qdq, learned)
    onnx.save(qdq, str(out_path))
    return {**recipe, "learned": {
        "method": method, "library": "kiln (PyTorch)", "seconds": round(time.perf_counter() - started, 2), "budget_seconds": budget,
        **order, "inputs": "as the quantized graph computes them, layers above learned first",
        **({"blocks": len(blocks), "block_layers_max": BLOCK_LAYERS} if method == "brecq" else {}),
        "layers": results, "skipped": [{"node": layer.node, "reason": layer.skipped} for layer in layers if layer.skipped],
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        # One curve for the report: each step's loss relative to rounding to nearest, layer (or block) after layer.
        "curve": [round(value / max(row["mse_nearest"], 1e-20), 5) for row in results for value in row["curve"]],
    }}


def _build_qat(model_path: Path, out_path: Path, *, fp32, qdq, recipe: dict, layers, calibration_path: Path, learn: dict,
               budget: float, started: float) -> dict[str, Any]:
    """Distil a fake-quantized student from the FP32 teacher, then write its weights into the calibrated QDQ graph: the
    activation scales it trained against stay, its weights are quantized as it quantized them (layers.write_tuned_weights)."""
    usable = [layer for layer in layers if layer.skipped is None]
    try:
        student = build_student(fp32, usable, quantized_activations(qdq, fp32), fixed=quantized_initializers(qdq, fp32))
    except UnsupportedGraph as exc:
        raise LearningNotApplicable(f"QAT skipped: {exc}") from exc
    float_weights = _float_weights(qdq, student.weight_names)
    output_names = distillation_targets(fp32)
    student.output_names = output_names
    probe = gather_tensors(model_path, output_names, _calibration_batches(model_path, calibration_path, 1)[:1])
    per_sample = sum(value[:1].nbytes for value in probe.values()) or 1
    samples = max(1, min(int(learn.get("learn_samples", DEFAULT_SAMPLES)), (int(learn.get("learn_memory_mb", DEFAULT_MEMORY_MB)) << 20) // per_sample))
    batches = _calibration_batches(model_path, calibration_path, samples)
    teacher = [gather_tensors(model_path, output_names, [batch]) for batch in batches]
    # Training gets what is left of the budget, less a little for writing the graph.
    remaining = budget - (time.perf_counter() - started)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = distill(student, {layer.weight_name for layer in usable} | float_weights, batches, teacher, seconds=max(0.0, remaining * 0.95),
                         learning_rate=float(learn.get("learn_rate", LEARNING_RATE)))
    finally:
        torch.set_num_threads(threads)
    quantized, floats = export_weights(student, usable, float_weights)
    write_tuned_weights(qdq, fp32, usable, quantized, floats)
    onnx.save(qdq, str(out_path))
    return {**recipe, "learned": {
        "method": "qat", "library": "kiln (PyTorch interpreter)", "teacher": "fp32", "device": result.device,
        "written": "into the calibrated QDQ graph: its activation scales kept, weights and int32 biases requantized as the student quantized them",
        "seconds": round(time.perf_counter() - started, 2), "budget_seconds": budget, "samples": sum(len(next(iter(b.values()))) for b in batches),
        "learning_rate": result.learning_rate, "steps": result.steps, "loss_start": result.loss_start, "loss_end": result.loss_end,
        "kept_pass": result.kept_pass, "kept_loss": round(result.kept_loss, 6), "held_out_batches": result.held_out_batches,
        "distilled": output_names, "layers": len(usable), "float_weights_tuned": len(floats),
        "skipped": [{"node": layer.node, "reason": layer.skipped} for layer in layers if layer.skipped],
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1), "curve": [round(v, 6) for v in result.curve],
    }}


def _float_weights(qdq: onnx.ModelProto, names: list[str]) -> set[str]:
    """The student's weights that the QDQ graph keeps as float initializers of the same name (their layer is not quantized)."""
    floats = {tensor.name for tensor in qdq.graph.initializer if tensor.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)}
    return set(names) & floats
