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

from .adaround import downsample, fake_quantize
from .layers import Layer, QuantParams, quantize_bias
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
    learning_rate: float = LEARNING_RATE
    curve: list[float] = field(default_factory=list)
    # The weights returned: those of the pass over the data with the lowest mean loss, 0 = the untrained start.
    kept_pass: int = 0
    kept_loss: float = 0.0  # on the held-out batches (split_held_out)
    held_out_batches: int = 0


def straight_through(quantize):
    """A value hook that computes `quantize` forwards and passes the gradient through unchanged (straight-through)."""
    def hook(value):
        return value + (quantize(value) - value).detach()
    return hook


def quantize_weight(weight: torch.Tensor, params: QuantParams) -> tuple[torch.Tensor, torch.Tensor]:
    """(integers, scale) of a weight, symmetric per channel along `params.axis` (per tensor without one), the scale
    max|w| / qmax following the weight: what the student trains with and what is written into the QDQ graph."""
    if params.axis is None:
        scale = weight.detach().abs().max().clamp(min=1e-12) / params.qmax
    else:
        axis = params.axis % weight.dim()
        reduce = tuple(d for d in range(weight.dim()) if d != axis)
        scale = weight.detach().abs().amax(dim=reduce, keepdim=True).clamp(min=1e-12) / params.qmax
    return torch.clamp(torch.round(weight / scale), -params.qmax, params.qmax), scale


def _fake_quantized_weight(weight: torch.Tensor, params: QuantParams) -> torch.Tensor:
    integers, scale = quantize_weight(weight, params)
    return weight + (integers * scale - weight).detach()


def _fake_quantized_bias(layer: Layer, weight: torch.nn.Parameter):
    """The bias as the runtime adds it: int32 at input scale x the weight's current scale (layers.quantize_bias)."""
    def quantize(bias: torch.Tensor) -> torch.Tensor:
        _, weight_scale = quantize_weight(weight.detach(), layer.weight)
        integers, scale = quantize_bias(bias.detach().cpu().numpy(), layer.activation.scale, weight_scale.cpu().numpy())
        return torch.from_numpy((integers.astype(np.float64) * scale).astype(np.float32)).to(bias.device)
    return quantize


def build_student(fp32: onnx.ModelProto, layers: list[Layer], activations: dict[str, QuantParams],
                  fixed: dict[str, QuantParams] | None = None) -> OnnxModule:
    """The FP32 graph in PyTorch, fake-quantized exactly where and as the calibrated QDQ graph quantizes: every quantized
    tensor at its calibrated scale and zero point, each learned layer's weight per channel at a scale that follows it and
    its int32 bias; `fixed`: the other initializers the QDQ graph quantizes (layers.quantized_initializers), at their
    calibrated scales and never trained."""
    student = OnnxModule(fp32)
    parameters = student.named_weights()
    by_weight = {layer.weight_name: layer.weight for layer in layers}
    quantized = {**activations, **{layer.input_name: layer.activation for layer in layers}}
    for name, params in quantized.items():
        student.value_hooks[name] = straight_through(lambda value, params=params: fake_quantize(value, params))
    for layer in layers:
        if layer.quantized_bias_name and layer.bias_name in student.constants:
            student.value_hooks[layer.bias_name] = _fake_quantized_bias(layer, parameters[layer.weight_name])
    fix_quantized_initializers(student, fixed or {}, learned=set(by_weight) | {layer.bias_name for layer in layers if layer.quantized_bias_name})
    student.weight_hook = lambda name, weight: _fake_quantized_weight(weight, by_weight[name]) if name in by_weight else weight
    return student


def fix_quantized_initializers(module: OnnxModule, fixed: dict[str, QuantParams], *, learned: set[str]) -> None:
    """Write into `module` the initializers the QDQ graph quantizes (`fixed`, layers.quantized_initializers) as the runtime
    computes with them, at their calibrated scales, except the `learned` ones."""
    parameters = module.named_weights()
    with torch.no_grad():
        for name, params in fixed.items():
            if name in parameters and name not in learned:
                parameters[name].copy_(fake_quantize(parameters[name], params))  # never trained: see distill's `trainable`
            elif name in module.constants and name not in learned:
                module.constants[name] = fake_quantize(module.constants[name].float(), params).to(module.constants[name].dtype)


def export_weights(student: OnnxModule, layers: list[Layer], float_weights: set[str]) -> tuple[dict, dict]:
    """(quantized, floats) for layers.write_tuned_weights: each layer's integers and scale, computed by quantize_weight from
    the student's weight, and the weights the QDQ graph keeps in float."""
    weights = student.named_weights()
    quantized = {}
    for layer in layers:
        integers, scale = quantize_weight(weights[layer.weight_name].detach().cpu(), layer.weight)
        quantized[layer.weight_name] = (integers.numpy().astype(np.int64), scale.numpy().astype(np.float32))
    floats = {name: weights[name].detach().cpu().numpy().astype(np.float32) for name in float_weights if name in weights}
    return quantized, floats


def _snapshot(student: OnnxModule) -> dict[str, torch.Tensor]:
    return {name: parameter.detach().clone() for name, parameter in student.named_weights().items()}


def _restore(student: OnnxModule, weights: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, parameter in student.named_weights().items():
            parameter.copy_(weights[name])


HELD_OUT_SHARE = 0.25


def distillation_targets(fp32: onnx.ModelProto) -> list[str]:
    """What the student is trained to match, per graph output: a Softmax's or LogSoftmax's input (the logits) where the
    output is one, the output itself otherwise. Probabilities near 0 and 1 carry almost no error energy, so a classifier's
    flipped decisions hardly show in a loss on them; its logits show them."""
    producers = {output: node for node in fp32.graph.node for output in node.output}
    targets = []
    for output in fp32.graph.output:
        producer = producers.get(output.name)
        targets.append(producer.input[0] if producer is not None and producer.op_type in ("Softmax", "LogSoftmax") else output.name)
    return targets


def split_held_out(count: int) -> tuple[list[int], list[int]]:
    """(training, held-out) batch indices: a quarter of the batches, the last ones, judge which pass is kept, so that
    a student that only learns the calibration samples by heart is not the one shipped. One batch alone trains and judges."""
    indices = list(range(count))
    if count < 2:
        return indices, indices
    held = max(1, int(count * HELD_OUT_SHARE))
    return indices[:count - held], indices[count - held:]


def distill(student: OnnxModule, trainable: set[str], batches: list[dict[str, np.ndarray]], teacher: list[dict[str, np.ndarray]],
            *, seconds: float, learning_rate: float = LEARNING_RATE, seed: int = 0) -> DistillResult:
    """Fine-tune the student's `trainable` weights within `seconds` (build_student); it ends holding the kept weights."""
    torch.manual_seed(seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    student.to(device)
    student.constants = {name: value.to(device) for name, value in student.constants.items()}
    parameters = [parameter for name, parameter in student.named_weights().items() if name in trainable]
    for name, parameter in student.named_weights().items():
        parameter.requires_grad_(name in trainable)
    optimizer = torch.optim.Adam(parameters, lr=learning_rate)
    inputs = [[torch.from_numpy(batch[name]).to(device) for name in student.input_names] for batch in batches]
    targets = [[torch.from_numpy(outputs[name]).to(device) for name in student.output_names] for outputs in teacher]
    energy = [sum(float(torch.mean(t ** 2)) for t in target) + 1e-12 for target in targets]
    training, held_out = split_held_out(len(inputs))

    def batch_loss(index: int) -> torch.Tensor:
        outputs = student(*inputs[index])
        return sum(torch.mean((out - target) ** 2) for out, target in zip(outputs, targets[index], strict=True)) / energy[index]

    def held_out_loss() -> float:
        with torch.no_grad():
            return float(np.mean([float(batch_loss(index)) for index in held_out]))

    result, losses, started = DistillResult(device=str(device), learning_rate=learning_rate), [], time.perf_counter()
    # Fine-tuning can drift away from a start that is already close (a well-calibrated graph), or learn the calibration
    # samples by heart: keep the pass with the lowest loss on held-out batches, so that the student never ends worse than
    # it began by that measure.
    result.kept_loss = held_out_loss()
    result.held_out_batches = len(held_out) if held_out != training else 0
    best = _snapshot(student)
    while result.steps < MAX_STEPS and time.perf_counter() - started < seconds:
        loss = batch_loss(training[result.steps % len(training)])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        result.steps += 1
        if result.steps % len(training) == 0 and (judged := held_out_loss()) < result.kept_loss:
            result.kept_loss, result.kept_pass, best = judged, result.steps // len(training), _snapshot(student)
    _restore(student, best)
    result.seconds = time.perf_counter() - started
    result.curve = downsample(losses)
    result.loss_start, result.loss_end = (losses[0], float(np.mean(losses[-max(1, len(training)):]))) if losses else (0.0, 0.0)
    return result
