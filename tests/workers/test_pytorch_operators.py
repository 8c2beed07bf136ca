"""The operator allow-list for PyTorch uploads: what it lets through, what it refuses, and that it is current."""
from __future__ import annotations

import pytest

from tests.fixtures import torch_models
from workers.pytorch import operators
from workers.pytorch.scan import RefusedTorchFile, _check_load_time_code, scan_torch_file

pytestmark = pytest.mark.timeout(300)


def test_the_list_holds_arithmetic_and_nothing_that_reaches_outside():
    allowed = operators.allowed()
    assert {"aten::_convolution", "aten::linear", "aten::matmul", "aten::softmax", "prim::GetAttr", "quantized::linear"} <= allowed
    for name in ("aten::from_file", "aten::save", "aten::load", "prim::fork", "aten::wait", "prim::Print", "prim::PythonOp",
                 "aten::set_", "aten::manual_seed", "aten::_cufft_set_plan_cache_max_size"):
        assert operators.refused([name]) == [name]


def test_the_committed_list_is_what_the_pinned_pytorch_exports():
    """When the PyTorch pin moves, regenerate the list (operators.py says how) and review the difference."""
    assert operators.exporter_operators() | set(operators.STRUCTURAL) == set(operators.allowed())


def test_operator_names_are_read_in_every_spelling():
    assert operators.base_name("aten::add.Tensor") == "aten::add"
    assert operators.base_name("torch.ops.aten.from_file.default") == "aten::from_file"
    assert operators.refused(["torch.ops.aten.relu.default", "torch.ops.aten.from_file.default"]) == ["aten::from_file"]


@pytest.mark.parametrize("maker", [torch_models.save_torchscript, torch_models.save_export])
def test_the_test_models_use_only_allowed_operators(tmp_path, maker):
    from workers.pytorch.export import load_model
    from workers.pytorch.scan import TORCH_EXPORT, TORCHSCRIPT

    path = maker(tmp_path / ("m.pt2" if maker is torch_models.save_export else "m.pt"))
    load_model(TORCH_EXPORT if maker is torch_models.save_export else TORCHSCRIPT, path)  # raises RefusedOperators otherwise


def test_a_dynamically_quantized_model_passes_the_static_check(tmp_path):
    import torch

    model = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()), {torch.nn.Linear})
    path = tmp_path / "quantized.pt"
    torch.jit.trace(model, torch.zeros(2, 8)).save(str(path))
    assert scan_torch_file(path).kind == "torchscript"


LOAD_TIME = """class Packed(Module):
  def forward(self, x):
    return x
  def __setstate__(self, state: Tuple[Tensor]) -> None:
    w = torch.add(state[0], 1)
    self.w = ops.quantized.linear_prepack(w, None)
    return None
"""


def test_code_that_runs_while_loading_is_checked_before_loading():
    _check_load_time_code(LOAD_TIME, label="code/__torch__.py")
    with pytest.raises(RefusedTorchFile) as refused:
        _check_load_time_code(LOAD_TIME.replace("torch.add(state[0], 1)", 'torch.from_file("/etc/shadow", False, 4)'), label="code/x.py")
    assert refused.value.code == "forbidden_operator" and "aten::from_file" in str(refused.value) and "__setstate__" in str(refused.value)
