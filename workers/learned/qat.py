"""Quantization-aware fine-tuning with distillation: the FP32 model is the teacher, the unlabeled
calibration set the data. The student is the same graph in PyTorch (torch_graph.py) with fake
quantization where the runtime will quantize: per-channel symmetric weights (scales follow the
weights as they move) and each learnable layer's input at the scale calibration chose. The loss is
the student's outputs against the teacher's, relative to the teacher's energy; the loss of every
step is kept, and the weights returned are those of the pass over the data with the lowest mean loss
(the untrained start counts as pass 0), so a start that is already close never ends worse. Runs on CUDA when PyTorch sees a GPU, else on the CPU.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from .adaround import downsample, fake_quantize
from .layers import Layer, QuantParams
from .torch_graph import OnnxModule

LEARNING_RATE = 1e-4
MAX_STEPS = 5000


@dataclass
class DistillResult:
    steps: int = 0
    seconds: float = 0.0
    loss_start: float = 0.0
    loss_end: float = 0.0
    device: str = "cpu"
    curve: list[float] = field(default_factory=list)
    # The weights returned: those of the pass over the data with the lowest mean loss, 0 = the untrained start.
    kept_pass: int = 0
    kept_loss: float = 0.0


def _straight_through(quantize):
    def hook(value):
        return value + (quantize(value) - value).detach()
    return hook


def _weight_quantizer(params: QuantParams):
    """Per-channel symmetric weight quantization whose scale follows the weight (as the quantizer will compute it)."""
    def quantize(name, weight):
        if params.axis is None:
            scale = weight.detach().abs().max().clamp(min=1e-12) / params.qmax
        else:
            axis = params.axis % weight.dim()
            reduce = tuple(d for d in range(weight.dim()) if d != axis)
            scale = weight.detach().abs().amax(dim=reduce, keepdim=True).clamp(min=1e-12) / params.qmax
        return weight + ((torch.clamp(torch.round(weight / scale), -params.qmax, params.qmax) * scale) - weight).detach()
    return quantize


def _install_fake_quantization(student: OnnxModule, layers: list[Layer], activations: dict[str, QuantParams]) -> None:
    by_weight = {layer.weight_name: layer.weight for layer in layers}
    quantized = {**activations, **{layer.input_name: layer.activation for layer in layers}}
    for name, params in quantized.items():
        student.value_hooks[name] = _straight_through(lambda value, params=params: fake_quantize(value, params))
    student.weight_hook = lambda name, weight: _weight_quantizer(by_weight[name])(name, weight) if name in by_weight else weight


def _snapshot(student: OnnxModule) -> dict[str, torch.Tensor]:
    return {name: parameter.detach().clone() for name, parameter in student.named_weights().items()}


def _restore(student: OnnxModule, weights: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, parameter in student.named_weights().items():
            parameter.copy_(weights[name])


def distill(fp32: onnx.ModelProto, layers: list[Layer], batches: list[dict[str, np.ndarray]], teacher: list[dict[str, np.ndarray]],
            *, seconds: float, activations: dict[str, QuantParams] | None = None, seed: int = 0) -> tuple[onnx.ModelProto, DistillResult]:
    """Fine-tune the student within `seconds`; returns the FP32 graph with the tuned weights. `activations`: the other
    tensors the runtime quantizes (layers.quantized_activations), fake-quantized in the student too."""
    torch.manual_seed(seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    student = OnnxModule(fp32).to(device)
    student.constants = {name: value.to(device) for name, value in student.constants.items()}
    _install_fake_quantization(student, layers, activations or {})
    optimizer = torch.optim.Adam(student.weights.parameters(), lr=LEARNING_RATE)
    inputs = [[torch.from_numpy(batch[name]).to(device) for name in student.input_names] for batch in batches]
    targets = [[torch.from_numpy(outputs[name]).to(device) for name in student.output_names] for outputs in teacher]
    energy = [sum(float(torch.mean(t ** 2)) for t in target) + 1e-12 for target in targets]

    def batch_loss(index: int) -> torch.Tensor:
        outputs = student(*inputs[index])
        return sum(torch.mean((out - target) ** 2) for out, target in zip(outputs, targets[index], strict=True)) / energy[index]

    result, losses, started = DistillResult(device=str(device)), [], time.perf_counter()
    # Fine-tuning can drift away from a start that is already close (a well-calibrated graph): keep the best pass, so
    # that the student never ends worse than it began by its own measure.
    with torch.no_grad():
        result.kept_loss = float(np.mean([float(batch_loss(index)) for index in range(len(inputs))]))
    best = _snapshot(student)
    while result.steps < MAX_STEPS and time.perf_counter() - started < seconds:
        loss = batch_loss(result.steps % len(inputs))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        result.steps += 1
        if result.steps % len(inputs) == 0 and float(np.mean(losses[-len(inputs):])) < result.kept_loss:
            result.kept_loss, result.kept_pass, best = float(np.mean(losses[-len(inputs):])), result.steps // len(inputs), _snapshot(student)
    _restore(student, best)
    result.seconds = time.perf_counter() - started
    result.curve = downsample(losses)
    result.loss_start, result.loss_end = (losses[0], float(np.mean(losses[-max(1, len(inputs)):]))) if losses else (0.0, 0.0)
    tuned = onnx.ModelProto()
    tuned.CopyFrom(fp32)
    weights = {name: parameter.detach().cpu().numpy() for name, parameter in student.named_weights().items()}
    for index, tensor in enumerate(tuned.graph.initializer):
        if tensor.name in weights:
            tuned.graph.initializer[index].CopyFrom(numpy_helper.from_array(weights[tensor.name].astype(np.float32), tensor.name))
    return tuned, result
