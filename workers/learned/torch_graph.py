"""An ONNX graph as a differentiable PyTorch module, for quantization-aware fine-tuning.

A small interpreter rather than onnx2torch: onnx2torch needs torchvision, which pip can only bring
in with a CUDA build of PyTorch that replaces the CPU one pinned here. It covers the operators of
common CNN, MLP and transformer-encoder graphs; a graph with anything else raises UnsupportedGraph with the operators'
names, and the learned variant is skipped with that reason. Only the weights of Conv, Gemm and
MatMul are parameters; every other initializer is a constant.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx
import torch
import torch.nn.functional as functional
from onnx import helper, numpy_helper

from .layers import LEARNABLE_OPS


class UnsupportedGraph(Exception):
    """The graph uses operators this interpreter does not run."""


def _attributes(node: onnx.NodeProto) -> dict:
    return {attribute.name: helper.get_attribute_value(attribute) for attribute in node.attribute}


def convolution_pads(x, kernel: list[int], a) -> list[int]:
    """ONNX pads [begin..., end...], with auto_pad SAME_UPPER/SAME_LOWER resolved for this input's size."""
    spatial = len(kernel)
    auto_pad = a.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad in ("NOTSET", "VALID"):
        return list(a.get("pads") or [0] * (2 * spatial)) if auto_pad == "NOTSET" else [0] * (2 * spatial)
    strides, dilations = a.get("strides") or [1] * spatial, a.get("dilations") or [1] * spatial
    begin, end = [], []
    for size, k, stride, dilation in zip(x.shape[2:], kernel, strides, dilations, strict=True):
        total = max((-(-int(size) // stride) - 1) * stride + (k - 1) * dilation + 1 - int(size), 0)
        small, large = total // 2, total - total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else large)
        end.append(large if auto_pad == "SAME_UPPER" else small)
    return begin + end


def _conv(inputs, a):
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 else None
    spatial = w.dim() - 2
    pads = convolution_pads(x, list(w.shape[2:]), a)
    if pads[:spatial] != pads[spatial:]:
        x = functional.pad(x, [p for pair in zip(reversed(pads[:spatial]), reversed(pads[spatial:]), strict=True) for p in pair])
        padding = 0
    else:
        padding = tuple(pads[:spatial])
    convolve = {1: functional.conv1d, 2: functional.conv2d, 3: functional.conv3d}[spatial]
    return convolve(x, w, b, stride=tuple(a.get("strides") or [1] * spatial), padding=padding,
                    dilation=tuple(a.get("dilations") or [1] * spatial), groups=int(a.get("group", 1)))


def _gemm(inputs, a):
    x = inputs[0].transpose(-1, -2) if a.get("transA") else inputs[0]
    w = inputs[1].transpose(-1, -2) if a.get("transB") else inputs[1]
    out = a.get("alpha", 1.0) * (x @ w)
    return out + a.get("beta", 1.0) * inputs[2] if len(inputs) > 2 else out


def _pool(kind):
    def run(inputs, a):
        x = inputs[0]
        spatial = x.dim() - 2
        kernel = tuple(a["kernel_shape"])
        pads = convolution_pads(x, list(kernel), a)
        if pads[:spatial] != pads[spatial:]:
            if kind != "MaxPool":
                raise UnsupportedGraph(f"{kind} with asymmetric pads")
            x = functional.pad(x, [p for pair in zip(reversed(pads[:spatial]), reversed(pads[spatial:]), strict=True) for p in pair],
                               value=-math.inf)
            pads = [0] * (2 * spatial)
        stride = tuple(a.get("strides") or [1] * spatial)
        if kind == "MaxPool":
            return {1: functional.max_pool1d, 2: functional.max_pool2d}[spatial](x, kernel, stride, tuple(pads[:spatial]), ceil_mode=bool(a.get("ceil_mode", 0)))
        return {1: functional.avg_pool1d, 2: functional.avg_pool2d}[spatial](x, kernel, stride, tuple(pads[:spatial]), ceil_mode=bool(a.get("ceil_mode", 0)),
                                                                              count_include_pad=bool(a.get("count_include_pad", 0)))
    return run


def _reshape(inputs, a):
    shape = [int(v) for v in inputs[1].tolist()]
    shape = [inputs[0].shape[i] if v == 0 and not a.get("allowzero") else v for i, v in enumerate(shape)]
    return inputs[0].reshape(shape)


def _axes(inputs, a) -> list[int]:
    return [int(v) for v in (inputs[1].tolist() if len(inputs) > 1 else a.get("axes", []))]


def _unsqueeze(inputs, a):
    out = inputs[0]
    for axis in sorted(_axes(inputs, a)):
        out = out.unsqueeze(axis)
    return out


def _squeeze(inputs, a):
    axes = _axes(inputs, a)
    return inputs[0].squeeze() if not axes else inputs[0].squeeze(tuple(axes))


def _batch_norm(inputs, a):
    x, scale, bias, mean, var = inputs[:5]
    return functional.batch_norm(x, mean, var, scale, bias, training=False, eps=a.get("epsilon", 1e-5))


def _clip(inputs, a):
    low = inputs[1] if len(inputs) > 1 and inputs[1] is not None else a.get("min")
    high = inputs[2] if len(inputs) > 2 and inputs[2] is not None else a.get("max")
    return torch.clamp(inputs[0], min=low, max=high)


def _conv_transpose(inputs, a):
    x, w = inputs[0], inputs[1]
    spatial = w.dim() - 2
    pads = list(a.get("pads") or [0] * (2 * spatial))
    if a.get("output_shape") or pads[:spatial] != pads[spatial:] or spatial not in (1, 2, 3):
        raise UnsupportedGraph("ConvTranspose with output_shape or asymmetric pads")
    transpose = {1: functional.conv_transpose1d, 2: functional.conv_transpose2d, 3: functional.conv_transpose3d}[spatial]
    return transpose(x, w, inputs[2] if len(inputs) > 2 else None, stride=tuple(a.get("strides") or [1] * spatial),
                     padding=tuple(pads[:spatial]), output_padding=tuple(a.get("output_padding") or [0] * spatial),
                     groups=int(a.get("group", 1)), dilation=tuple(a.get("dilations") or [1] * spatial))


def _reduce_mean(inputs, a):
    axes = _axes(inputs, a) or list(range(inputs[0].dim()))
    return inputs[0].mean(dim=tuple(axes), keepdim=bool(a.get("keepdims", 1)))


# Resize modes that torch's interpolate computes exactly as ONNX defines them: (mode, coordinate mode, nearest mode) -> torch mode.
_RESIZE_MODES = {("nearest", "asymmetric", "floor"): ("nearest", None),
                 ("linear", "half_pixel", None): ("bilinear", False), ("linear", "pytorch_half_pixel", None): ("bilinear", False),
                 ("linear", "align_corners", None): ("bilinear", True)}


def _resize_mode(a) -> tuple[str, bool | None]:
    def text(name, default):
        value = a.get(name, default)
        return value.decode() if isinstance(value, bytes) else value

    mode = text("mode", "nearest")
    key = (mode, text("coordinate_transformation_mode", "half_pixel"), text("nearest_mode", "round_prefer_floor") if mode == "nearest" else None)
    if key not in _RESIZE_MODES:
        raise UnsupportedGraph(f"Resize {'/'.join(k for k in key if k)}")
    return _RESIZE_MODES[key]


def _resize(inputs, a):
    x = inputs[0]
    mode, align_corners = _resize_mode(a)
    sizes = inputs[3] if len(inputs) > 3 and inputs[3] is not None and inputs[3].numel() else None
    if sizes is not None:
        size = [int(v) for v in sizes.tolist()[2:]]
        return functional.interpolate(x, size=size, mode=mode, align_corners=align_corners)
    scales = [float(v) for v in inputs[2].tolist()]
    if scales[:2] != [1.0, 1.0]:
        raise UnsupportedGraph("Resize over batch or channels")
    return functional.interpolate(x, scale_factor=scales[2:], mode=mode, align_corners=align_corners)


def _layer_norm(inputs, a):
    x = inputs[0]
    axis = int(a.get("axis", -1)) % x.dim()
    shape = tuple(x.shape[axis:])
    return functional.layer_norm(x, shape, inputs[1] if len(inputs) > 1 else None, inputs[2] if len(inputs) > 2 else None,
                                 eps=a.get("epsilon", 1e-5))


def _gather(inputs, a):
    """Gather along an axis; negative indices count from the end, as in ONNX."""
    data, indices = inputs[0], inputs[1].long()
    axis = int(a.get("axis", 0)) % data.dim()
    indices = torch.where(indices < 0, indices + data.shape[axis], indices)
    out = torch.index_select(data, axis, indices.reshape(-1))
    return out.reshape(*data.shape[:axis], *indices.shape, *data.shape[axis + 1:])


def _slice(inputs, a):
    """Slice (opset 10+: starts, ends, axes, steps as inputs; opset 1-9: attributes); ends past the size are clamped, as in ONNX."""
    x = inputs[0]
    if len(inputs) > 1:
        starts, ends = inputs[1].tolist(), inputs[2].tolist()
        axes = inputs[3].tolist() if len(inputs) > 3 and inputs[3] is not None else list(range(len(starts)))
        steps = inputs[4].tolist() if len(inputs) > 4 and inputs[4] is not None else [1] * len(starts)
    else:
        starts, ends = a["starts"], a["ends"]
        axes, steps = a.get("axes") or list(range(len(starts))), [1] * len(starts)
    index = [slice(None)] * x.dim()
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        if step <= 0:
            raise UnsupportedGraph("Slice with a negative step")
        size = x.shape[int(axis)]
        index[int(axis)] = slice(*slice(int(start), int(min(end, size)) if end >= 0 else int(end), int(step)).indices(size))
    return x[tuple(index)]


def _shape(inputs, a):
    """The input's shape as int64 (opset 15's start and end too): it feeds Reshape targets, computed per batch."""
    dims = list(inputs[0].shape)
    return torch.tensor(dims[a.get("start", 0):a.get("end", len(dims))], dtype=torch.int64)


OPS: dict[str, Callable] = {
    "Conv": _conv, "Gemm": _gemm, "MatMul": lambda i, a: i[0] @ i[1],
    "Add": lambda i, a: i[0] + i[1], "Sub": lambda i, a: i[0] - i[1], "Mul": lambda i, a: i[0] * i[1], "Div": lambda i, a: i[0] / i[1],
    "Relu": lambda i, a: torch.relu(i[0]), "Sigmoid": lambda i, a: torch.sigmoid(i[0]), "Tanh": lambda i, a: torch.tanh(i[0]),
    "LeakyRelu": lambda i, a: functional.leaky_relu(i[0], a.get("alpha", 0.01)), "Clip": _clip,
    "HardSigmoid": lambda i, a: torch.clamp(a.get("alpha", 0.2) * i[0] + a.get("beta", 0.5), 0, 1),
    "MaxPool": _pool("MaxPool"), "AveragePool": _pool("AveragePool"),
    "GlobalAveragePool": lambda i, a: i[0].mean(dim=tuple(range(2, i[0].dim())), keepdim=True),
    "Flatten": lambda i, a: i[0].reshape(int(np.prod(i[0].shape[:a.get("axis", 1)])) if a.get("axis", 1) else 1, -1),
    "Reshape": _reshape, "Transpose": lambda i, a: i[0].permute(*(a.get("perm") or reversed(range(i[0].dim())))),
    "Concat": lambda i, a: torch.cat(i, dim=a["axis"]), "Softmax": lambda i, a: torch.softmax(i[0], dim=a.get("axis", -1)),
    "BatchNormalization": _batch_norm, "Identity": lambda i, a: i[0], "Dropout": lambda i, a: i[0],
    "Unsqueeze": _unsqueeze, "Squeeze": _squeeze,
    "Erf": lambda i, a: torch.erf(i[0]), "Pow": lambda i, a: torch.pow(i[0], i[1]), "Sqrt": lambda i, a: torch.sqrt(i[0]),
    "LayerNormalization": _layer_norm, "Gather": _gather, "ReduceMean": _reduce_mean, "ConvTranspose": _conv_transpose, "Resize": _resize,
    "Slice": _slice, "HardSwish": lambda i, a: functional.hardswish(i[0]), "Shape": _shape,
}


class OnnxModule(torch.nn.Module):
    """Runs an ONNX graph with torch ops; the Conv/Gemm/MatMul weight initializers are trainable parameters."""

    def __init__(self, model: onnx.ModelProto):
        super().__init__()
        unsupported = sorted({node.op_type for node in model.graph.node if node.op_type not in OPS and node.op_type != "Constant"})
        if unsupported:
            raise UnsupportedGraph(f"the graph uses {', '.join(unsupported)}, which the PyTorch interpreter does not run")
        for node in model.graph.node:
            if node.op_type == "Resize":
                _resize_mode(_attributes(node))  # a mode torch computes differently is refused now, not mid-training
        self.nodes = list(model.graph.node)
        self.node_attributes = [_attributes(node) for node in self.nodes]
        initializers = {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer}
        learnable = {node.input[1] for node in self.nodes if node.op_type in LEARNABLE_OPS and len(node.input) > 1 and node.input[1] in initializers}
        self.weight_names = sorted(learnable)
        self.weights = torch.nn.ParameterList([torch.nn.Parameter(torch.from_numpy(initializers[name].astype(np.float32).copy())) for name in self.weight_names])
        self.constants = {name: torch.from_numpy(np.array(value)) for name, value in initializers.items() if name not in learnable}
        for node in self.nodes:
            if node.op_type == "Constant":
                self.constants[node.output[0]] = torch.from_numpy(np.array(numpy_helper.to_array(_attributes(node)["value"])))
        initializer_names = set(initializers)
        self.input_names = [value.name for value in model.graph.input if value.name not in initializer_names]
        self.output_names = [value.name for value in model.graph.output]
        # Hooks that may replace a value (fake quantization): name -> function(tensor) -> tensor.
        self.value_hooks: dict[str, Callable] = {}
        self.weight_hook: Callable | None = None

    def named_weights(self) -> dict[str, torch.nn.Parameter]:
        return dict(zip(self.weight_names, self.weights, strict=True))

    def forward(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        values: dict[str, torch.Tensor] = {name: self.value_hooks[name](value) if name in self.value_hooks else value
                                           for name, value in self.constants.items()}
        for name, parameter in self.named_weights().items():
            values[name] = self.weight_hook(name, parameter) if self.weight_hook else parameter
        for name, value in zip(self.input_names, inputs, strict=True):
            values[name] = self.value_hooks[name](value) if name in self.value_hooks else value
        for node, attributes in zip(self.nodes, self.node_attributes, strict=True):
            if node.op_type == "Constant":
                continue
            arguments = [values[name] if name else None for name in node.input]
            out = OPS[node.op_type](arguments, attributes)
            name = node.output[0]
            values[name] = self.value_hooks[name](out) if name in self.value_hooks else out
        return [values[name] for name in self.output_names]
