"""AdaRound: learn, per layer, whether each weight rounds up or down, so that the layer's output on
calibration data (with its input quantized as the runtime will) matches FP32's (Nagel et al. 2020).

Each weight's integer is floor(W / s) + h, with h a rectified sigmoid of a learned variable pushed
towards 0 or 1 by an annealed regulariser, s and the zero point being ONNX Runtime's own. Every tenth
step, the loss with hard rounding is kept (the learning curve in the report). The learning loop
(`learn_rounding`) takes any number of roundings and any forward computation: BRECQ (brecq.py) learns
the roundings of a block of layers with it, against the block's output.
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
class RoundingResult:
    """What learning the rounding of one layer (AdaRound), or of a block of layers together (BRECQ), gave."""

    node: str
    steps: int = 0
    seconds: float = 0.0
    mse_nearest: float = 0.0
    mse_learned: float = 0.0
    curve: list[float] = field(default_factory=list)
    integers: list[np.ndarray] = field(default_factory=list)  # one per rounding, in the order given

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

    rounding = Rounding(weight, layer.weight)
    b = torch.from_numpy(bias) if bias is not None else None
    x = fake_quantize(torch.from_numpy(inputs), layer.activation)
    return relative_error(lambda weights, xs: layer_forward(layer, xs, weights[0], b), [rounding.weights(rounding.nearest)], x,
                          torch.from_numpy(targets))


def relative_error(forward, weights: list, inputs, targets) -> float:
    """The squared error of `forward(weights, inputs)` against `targets`, relative to the targets' energy."""
    import torch

    with torch.no_grad():
        out = forward(weights, inputs)
        return float(torch.mean((out - targets) ** 2) / torch.clamp(torch.mean(targets ** 2), min=1e-20))


def _rectified_sigmoid(variable):
    import torch

    return torch.clamp(torch.sigmoid(variable) * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)


class Rounding:
    """The learnable rounding of one quantized weight: its integers are floor(W / s) + h + zero point, h a rectified
    sigmoid of `variable` (started where h is W / s's fractional part, so that learning starts from the weight itself);
    s, the zero point, the range and the axis are the runtime's own (`params`)."""

    def __init__(self, weight: np.ndarray, params: QuantParams):
        import torch

        w = torch.from_numpy(weight)
        self.params = params
        self.scale, self.zero = _broadcast(params, w.dim(), w)
        self.floor = torch.floor(w / self.scale)
        self.nearest = torch.round(w / self.scale) - self.floor
        rest = (w / self.scale - self.floor).clamp(1e-4, 1 - 1e-4)
        self.variable = (-torch.log((ZETA - GAMMA) / (rest - GAMMA) - 1)).requires_grad_(True)

    def soft(self):
        """h while learning: between 0 and 1, differentiable."""
        return _rectified_sigmoid(self.variable)

    def hard(self):
        """h if learning stopped now: each weight rounded up or down."""
        return (self.variable.detach() >= 0).to(self.floor.dtype)

    def weights(self, h):
        """The dequantized weight for this h, as DequantizeLinear gives it."""
        import torch

        return (torch.clamp(self.floor + h + self.zero, self.params.qmin, self.params.qmax) - self.zero) * self.scale

    def integers(self, h) -> np.ndarray:
        """The integers for this h, as the QDQ graph stores them."""
        import torch

        return torch.clamp(self.floor + h + self.zero, self.params.qmin, self.params.qmax).numpy().astype(np.int32)


def rounding_regulariser(roundings: list[Rounding], progress: float):
    """AdaRound's annealed push of every h towards 0 or 1 (mean over all weights), or None during the warm-up: the
    exponent beta falls from BETA_START to BETA_END on a cosine, so that the push starts gently and ends decisive."""
    import torch

    if progress <= WARMUP:
        return None
    beta = BETA_END + 0.5 * (BETA_START - BETA_END) * (1 + math.cos(math.pi * (progress - WARMUP) / (1 - WARMUP)))
    h = torch.cat([rounding.soft().reshape(-1) for rounding in roundings])
    return (1 - (2 * h - 1).abs().pow(beta)).mean()


def learn_layer(layer: Layer, *, weight: np.ndarray, bias: np.ndarray | None, inputs: np.ndarray, targets: np.ndarray,
                seconds: float, max_steps: int, seed: int = 0) -> RoundingResult:
    """Learned rounding of one layer within `seconds`; returns its integers and the loss curve."""
    import torch

    b = torch.from_numpy(bias) if bias is not None else None
    x = fake_quantize(torch.from_numpy(inputs), layer.activation)
    return learn_rounding([Rounding(weight, layer.weight)], lambda weights, xs: layer_forward(layer, xs, weights[0], b),
                          inputs=x, targets=torch.from_numpy(targets), seconds=seconds, max_steps=max_steps, seed=seed, node=layer.node)


def learn_rounding(roundings: list[Rounding], forward, *, inputs, targets, seconds: float, max_steps: int, seed: int,
                   node: str, evaluation_rows: int | None = None) -> RoundingResult:
    """Learn the roundings together so that `forward(weights, inputs)` (one per rounding, in order) matches `targets`,
    within `seconds` and `max_steps`: one layer for AdaRound, a block of layers for BRECQ. Every CURVE_EVERY steps the loss
    with hard rounding is kept. Never worse than rounding to nearest on the first `evaluation_rows` samples (None: all),
    which also give `mse_nearest` and `mse_learned`: rounding to nearest is returned when learning ends worse."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam([rounding.variable for rounding in roundings], lr=LEARNING_RATE)
    evaluated = slice(0, evaluation_rows)

    def mse(hs, rows=None):
        with torch.no_grad():
            xs, ys = (inputs[evaluated], targets[evaluated]) if rows is None else (inputs[rows], targets[rows])
            return float(torch.mean((forward([r.weights(h) for r, h in zip(roundings, hs, strict=True)], xs) - ys) ** 2))

    # Measuring rounding to nearest is part of the time given: on a block of convolutions it is not negligible.
    started = time.perf_counter()
    result = RoundingResult(node=node)
    result.mse_nearest = mse([rounding.nearest for rounding in roundings])
    reference = max(result.mse_nearest, 1e-20)
    losses = []
    step = 0
    batch = batch_rows(targets)
    while step < max_steps and time.perf_counter() - started < seconds:
        rows = torch.randint(0, len(inputs), (batch,), generator=generator)
        reconstruction = torch.mean((forward([r.weights(r.soft()) for r in roundings], inputs[rows]) - targets[rows]) ** 2)
        progress = max(step / max(1, max_steps), (time.perf_counter() - started) / max(seconds, 1e-6))
        # Measured against rounding to nearest, so that one regularisation weight suits every layer's scale.
        loss = reconstruction / reference
        if (regulariser := rounding_regulariser(roundings, progress)) is not None:
            loss = loss + REGULARISATION * regulariser
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % CURVE_EVERY == 0:
            # The curve is what the variant would be if learning stopped here: the loss with hard rounding.
            losses.append(mse([rounding.hard() for rounding in roundings], rows))
        step += 1
    hard = [rounding.hard() for rounding in roundings]
    learned_mse = mse(hard)
    if learned_mse > result.mse_nearest:
        # Rounding to nearest is a valid answer too; never hand back something worse than it.
        hard, learned_mse = [rounding.nearest for rounding in roundings], result.mse_nearest
    result.integers = [rounding.integers(h) for rounding, h in zip(roundings, hard, strict=True)]
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
