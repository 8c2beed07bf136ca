"""AdaRound: learn, per layer, whether each weight rounds up or down, so that the layer's output on
calibration data (with its input quantized as the runtime will) matches FP32's (Nagel et al. 2020).

Each weight's integer is floor(W / s) + h, with h a rectified sigmoid of a learned variable pushed
towards 0 or 1 by an annealed regulariser, s and the zero point being ONNX Runtime's own. Every tenth
step, the loss with hard rounding is kept (the learning curve in the report).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from .layers import Layer, QuantParams
from .torch_graph import convolution_pads

ZETA, GAMMA = 1.1, -0.1
REGULARISATION = 0.01
WARMUP = 0.2
BETA_START, BETA_END = 20.0, 2.0
LEARNING_RATE = 1e-1
BATCH_ROWS = 256
# Output positions per step: a convolution's sample is H x W of them, so a step takes few images, many steps fit the budget.
BATCH_POSITIONS = 4096
CURVE_POINTS = 60
CURVE_EVERY = 10


@dataclass
class LayerResult:
    node: str
    steps: int = 0
    seconds: float = 0.0
    mse_nearest: float = 0.0
    mse_learned: float = 0.0
    curve: list[float] = field(default_factory=list)
    integers: np.ndarray | None = None

    def summary(self) -> dict:
        return {"node": self.node, "steps": self.steps, "seconds": round(self.seconds, 3), "mse_nearest": self.mse_nearest,
                "mse_learned": self.mse_learned, "curve": self.curve}


def _broadcast(params: QuantParams, ndim: int, values) -> tuple:
    import torch

    scale = torch.from_numpy(params.scale.astype(np.float32))
    zero = torch.from_numpy(params.zero_point.astype(np.float32))
    if params.axis is not None and scale.numel() > 1:
        shape = [1] * ndim
        shape[params.axis % ndim] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return scale, zero


def fake_quantize(values, params: QuantParams):
    """What QuantizeLinear then DequantizeLinear give for these values (no gradient needed: inputs are fixed)."""
    import torch

    scale, zero = _broadcast(params, values.dim(), values)
    return (torch.clamp(torch.round(values / scale) + zero, params.qmin, params.qmax) - zero) * scale


def layer_forward(layer: Layer, x, weight, bias):
    """The ONNX node's computation in torch (with a Relu the quantizer folded into it), for the ops find_layers accepts."""
    import torch

    output = _linear_part(layer, x, weight, bias)
    return torch.relu(output) if layer.extra.get("activation") == "relu" else output


def _linear_part(layer: Layer, x, weight, bias):
    import torch
    import torch.nn.functional as functional

    attributes = layer.attributes
    if layer.op_type == "MatMul":
        return torch.matmul(x, weight)
    if layer.op_type == "Gemm":
        a = x.transpose(-1, -2) if attributes.get("transA") else x
        b = weight.transpose(-1, -2) if attributes.get("transB") else weight
        out = attributes.get("alpha", 1.0) * torch.matmul(a, b)
        return out + attributes.get("beta", 1.0) * bias if bias is not None else out
    spatial = weight.dim() - 2
    pads = convolution_pads(x, list(weight.shape[2:]), attributes)
    begin, end = pads[:spatial], pads[spatial:]
    if begin != end:
        # F.pad takes the last dimension first.
        x = functional.pad(x, [p for pair in zip(reversed(begin), reversed(end), strict=True) for p in pair])
        padding = 0
    else:
        padding = tuple(begin)
    convolve = functional.conv2d if spatial == 2 else functional.conv1d
    return convolve(x, weight, bias, stride=tuple(attributes.get("strides") or [1] * spatial), padding=padding,
                    dilation=tuple(attributes.get("dilations") or [1] * spatial), groups=int(attributes.get("group", 1)))


def nearest_error(layer: Layer, *, weight: np.ndarray, bias: np.ndarray | None, inputs: np.ndarray, targets: np.ndarray) -> float:
    """Relative output error of rounding to nearest: how much a layer stands to gain from learning."""
    import torch

    w = torch.from_numpy(weight)
    scale, zero = _broadcast(layer.weight, w.dim(), w)
    rounded = (torch.clamp(torch.round(w / scale) + zero, layer.weight.qmin, layer.weight.qmax) - zero) * scale
    with torch.no_grad():
        x = fake_quantize(torch.from_numpy(inputs), layer.activation)
        y = torch.from_numpy(targets)
        out = layer_forward(layer, x, rounded, torch.from_numpy(bias) if bias is not None else None)
        return float(torch.mean((out - y) ** 2) / torch.clamp(torch.mean(y ** 2), min=1e-20))


def _rectified_sigmoid(variable):
    import torch

    return torch.clamp(torch.sigmoid(variable) * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)


def learn_layer(layer: Layer, *, weight: np.ndarray, bias: np.ndarray | None, inputs: np.ndarray, targets: np.ndarray,
                seconds: float, max_steps: int, seed: int = 0) -> LayerResult:
    """Learned rounding of one layer within `seconds`; returns its integers and the loss curve."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    w = torch.from_numpy(weight)
    b = torch.from_numpy(bias) if bias is not None else None
    x = fake_quantize(torch.from_numpy(inputs), layer.activation)
    y = torch.from_numpy(targets)
    scale, zero = _broadcast(layer.weight, w.dim(), w)
    floor = torch.floor(w / scale)
    rest = (w / scale - floor).clamp(1e-4, 1 - 1e-4)
    variable = (-torch.log((ZETA - GAMMA) / (rest - GAMMA) - 1)).requires_grad_(True)
    optimizer = torch.optim.Adam([variable], lr=LEARNING_RATE)

    def weights_for(h):
        return (torch.clamp(floor + h + zero, layer.weight.qmin, layer.weight.qmax) - zero) * scale

    def mse(h, rows=None):
        with torch.no_grad():
            xs, ys = (x, y) if rows is None else (x[rows], y[rows])
            return float(torch.mean((layer_forward(layer, xs, weights_for(h), b) - ys) ** 2))

    result = LayerResult(node=layer.node)
    result.mse_nearest = mse(torch.round(w / scale) - floor)
    reference = max(result.mse_nearest, 1e-20)
    losses = []
    started = time.perf_counter()
    step = 0
    batch = batch_rows(y)
    while step < max_steps and time.perf_counter() - started < seconds:
        rows = torch.randint(0, len(x), (batch,), generator=generator)
        h = _rectified_sigmoid(variable)
        reconstruction = torch.mean((layer_forward(layer, x[rows], weights_for(h), b) - y[rows]) ** 2)
        progress = max(step / max(1, max_steps), (time.perf_counter() - started) / max(seconds, 1e-6))
        # Measured against rounding to nearest, so that one regularisation weight suits every layer's scale.
        loss = reconstruction / reference
        if progress > WARMUP:
            beta = BETA_END + 0.5 * (BETA_START - BETA_END) * (1 + math.cos(math.pi * (progress - WARMUP) / (1 - WARMUP)))
            loss = loss + REGULARISATION * (1 - (2 * h - 1).abs().pow(beta)).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % CURVE_EVERY == 0:
            # The curve is what the variant would be if learning stopped here: the loss with hard rounding.
            losses.append(mse((variable.detach() >= 0).to(w.dtype), rows))
        step += 1
    hard = (variable.detach() >= 0).to(w.dtype)
    learned_mse = mse(hard)
    if learned_mse > result.mse_nearest:
        # Rounding to nearest is a valid answer too; never hand back something worse than it.
        hard = torch.round(w / scale) - floor
        learned_mse = result.mse_nearest
    result.integers = torch.clamp(floor + hard + zero, layer.weight.qmin, layer.weight.qmax).numpy().astype(np.int32)
    result.mse_learned = learned_mse
    result.steps, result.seconds = step, time.perf_counter() - started
    result.curve = downsample(losses)
    return result


def batch_rows(targets) -> int:
    """Samples per step: BATCH_ROWS for a dense layer, fewer for a convolution with many output positions per sample."""
    positions = max(1, int(np.prod(targets.shape[2:]))) if targets.dim() > 2 else 1
    return max(1, min(len(targets), BATCH_ROWS, BATCH_POSITIONS // positions))


def downsample(values: list[float], points: int = CURVE_POINTS) -> list[float]:
    """At most `points` values: the mean of equal slices, so a curve of 5,000 steps still fits a report."""
    if len(values) <= points:
        return [float(v) for v in values]
    edges = np.linspace(0, len(values), points + 1).astype(int)
    return [float(np.mean(values[a:b])) for a, b in zip(edges[:-1], edges[1:], strict=True)]
