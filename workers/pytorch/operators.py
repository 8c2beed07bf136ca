"""The operators an uploaded PyTorch model may contain: an allow-list, checked before the model runs.

The list (`allowed_operators.txt`) is what PyTorch's two ONNX exporters can translate (the TorchScript
exporter's symbolic registry and the dynamo exporter's torchlib registry, for the PyTorch pinned in
pyproject) plus TorchScript's structural builtins, minus anything that touches files, the process or
threads. A model that calls an operator outside it (`aten::from_file`, `aten::save`, `prim::fork`, an
operator of another namespace) is refused with the operator's name. `python -m workers.pytorch.operators`
prints a fresh list from the installed PyTorch, for review when the pin moves.
"""
from __future__ import annotations

import functools
import importlib
import pkgutil
import re
from collections.abc import Iterable
from pathlib import Path

LIST_FILE = Path(__file__).with_name("allowed_operators.txt")
# Whatever an exporter registry may hold, these never belong to a model's arithmetic.
DENIED = re.compile(r"(file|save|load|storage|fork|wait|thread|print|profil|record|seed|_cuda|cudnn|mkldnn|inductor|_test|"
                    r"set_|_debug|distributed|rpc|python|pickle|manual_|_nnpack|_use_|_validate|_propagate)", re.IGNORECASE)
# TorchScript's structural operations and scalar helpers that tracing leaves in a graph; none reach outside the process.
STRUCTURAL = (
    "prim::GetAttr", "prim::SetAttr", "prim::NumToTensor", "prim::CallMethod", "prim::CallFunction", "prim::TupleIndex",
    "prim::TupleUnpack", "prim::TupleSlice", "prim::ListIndex", "prim::DictConstruct", "prim::DictIndex", "prim::RaiseException",
    "prim::Uninitialized", "prim::unchecked_cast", "prim::isinstance", "prim::is_cuda", "prim::requires_grad", "prim::Return",
    "prim::Param", "prim::BailOut", "prim::Guard", "prim::AutogradZero", "prim::ConstantChunk", "prim::Enter", "prim::Exit",
    "prim::EnumValue", "prim::EnumName", "prim::unchecked_unwrap_optional", "prim::abs",
    "aten::Int", "aten::Float", "aten::Bool", "aten::ScalarImplicit", "aten::IntImplicit", "aten::FloatImplicit",
    "aten::size", "aten::dim", "aten::len", "aten::numel", "aten::__getitem__", "aten::__is__", "aten::__isnot__", "aten::__not__",
    "aten::__contains__", "aten::_set_item", "aten::append", "aten::list", "aten::format", "aten::str", "aten::warn",
    "aten::detach", "aten::contiguous", "aten::dropout", "aten::feature_dropout", "aten::alpha_dropout", "aten::_shape_as_tensor",
    "aten::floordiv", "aten::__and__", "aten::__or__", "aten::__xor__", "aten::__round_to_zero_floordiv", "aten::__derive_index",
    "aten::__range_length", "aten::_unwrap_optional", "aten::dict", "aten::keys", "aten::values", "aten::items", "aten::extend",
    "aten::insert", "aten::pop", "aten::copy_", "aten::device", "aten::is_floating_point", "aten::requires_grad_",
    "_operator::getitem", "_operator::add", "_operator::sub", "_operator::mul", "_operator::floordiv", "_operator::truediv",
    "_operator::mod", "_operator::neg", "_operator::pow", "_operator::eq", "_operator::ne", "_operator::lt", "_operator::le",
    "_operator::gt", "_operator::ge", "_operator::and_", "_operator::or_", "_operator::not_", "math::ceil", "math::floor",
    "math::sqrt", "higher_order::cond", "higher_order::while_loop", "higher_order::map_impl", "higher_order::scan",
    # quantized modules pack their weights when loaded (their __setstate__) and unpack them to export
    "quantized::linear_prepack", "quantized::linear_prepack_fp16", "quantized::linear_unpack", "quantized::linear_unpack_fp16",
    "quantized::conv1d_prepack", "quantized::conv2d_prepack", "quantized::conv3d_prepack", "quantized::conv_transpose1d_prepack",
    "quantized::conv_transpose2d_prepack", "quantized::conv1d_unpack", "quantized::conv2d_unpack", "quantized::conv3d_unpack",
    "quantized::conv_transpose2d_unpack", "quantized::embedding_bag_prepack", "quantized::embedding_bag_unpack",
)


class RefusedOperators(ValueError):
    """The model calls operators outside the allow-list; the message names them."""

    code = "forbidden_operator"


@functools.cache
def allowed() -> frozenset[str]:
    lines = (line.strip() for line in LIST_FILE.read_text().splitlines())
    return frozenset(line for line in lines if line and not line.startswith("#"))


def base_name(kind: str) -> str:
    """`aten::add.Tensor` -> `aten::add`; `torch.ops.aten.add.Tensor` -> `aten::add`."""
    if kind.startswith("torch.ops."):
        namespace, _, rest = kind.removeprefix("torch.ops.").partition(".")
        kind = f"{namespace}::{rest}"
    namespace, _, name = kind.partition("::")
    return f"{namespace}::{name.split('.')[0]}" if name else kind


def refused(kinds: Iterable[str]) -> list[str]:
    """The operators among `kinds` a model may not call, sorted."""
    names = {base_name(kind) for kind in kinds}
    return sorted(name for name in names if name not in allowed() or DENIED.search(name.partition("::")[2]))


def check(kinds: Iterable[str], *, where: str) -> None:
    bad = refused(kinds)
    if bad:
        shown = ", ".join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
        raise RefusedOperators(f"{where} calls {shown}, which a model may not use: Kiln loads only models made of "
                               "computational operators (no file, process, thread or interpreter access)")


def exporter_operators() -> set[str]:
    """What the installed PyTorch's ONNX exporters can translate (for regenerating the list).

    The TorchScript exporter registers an opset's translations when its module is first imported (an export at that
    opset imports it), so every opset module is imported first: the answer must not depend on what ran before."""
    from torch.onnx._internal import torchscript_exporter
    from torch.onnx._internal.exporter import _registration
    from torch.onnx._internal.torchscript_exporter import registration

    for module in pkgutil.iter_modules(torchscript_exporter.__path__):
        if module.name.startswith("symbolic_opset"):
            importlib.import_module(f"{torchscript_exporter.__name__}.{module.name}")
    names = {name for name in registration.registry.all_functions() if not name.startswith("onnx::")}
    for key in _registration.ONNXRegistry.from_torchlib().functions:
        text = key if isinstance(key, str) else key.name() if callable(getattr(key, "name", None)) else ""
        if "::" in text:
            names.add(base_name(text))
    return {name for name in names if not DENIED.search(name.partition("::")[2])}


def main() -> None:
    print("# Operators an uploaded PyTorch model may call (workers/pytorch/operators.py explains the list).")
    print("# Regenerate with `python -m workers.pytorch.operators > workers/pytorch/allowed_operators.txt` and review the diff.")
    for name in sorted(exporter_operators() | set(STRUCTURAL)):
        print(name)


if __name__ == "__main__":
    main()
