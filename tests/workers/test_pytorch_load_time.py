"""Code that runs while a TorchScript file loads (`__setstate__` and everything it calls) is checked before the load.

Issue 34: the scan read only the text of `__setstate__`, so one that called `self.helper()` ran the helper's operators
(here `torch.from_file`, which creates a file) before any check; the check after loading then crashed with
"'function' object has no attribute 'graph'", and a scripted file with branches with "has been invalidated".
"""
from __future__ import annotations

import pytest

from tests.fixtures import torch_models
from workers.pytorch.sandbox import SandboxFailed, run_in_sandbox
from workers.pytorch.scan import RefusedTorchFile, check_load_time_code, scan_torch_file

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(300)


def test_a_setstate_that_calls_a_helper_is_refused_naming_the_helper_and_its_operator(tmp_path):
    target = tmp_path / "written-at-load"
    model = torch_models.save_load_time_helper(tmp_path / "loader.pt", target)
    with pytest.raises(RefusedTorchFile) as refused:
        scan_torch_file(model)
    message = str(refused.value)
    assert refused.value.code == "forbidden_operator"
    assert "Loader.__setstate__ (run while the file loads, with kiln_loader_module.Loader.helper)" in message
    assert "aten::from_file" in message
    assert not target.exists()


def test_the_check_after_loading_names_an_operator_of_load_time_code_instead_of_crashing(tmp_path):
    # The static scan is skipped here (the sandbox is what runs after it); the file maps a file in the sandbox's own /tmp
    # (a private tmpfs), so that the load succeeds and the check after it runs.
    import uuid

    inside = f"/tmp/kiln-made-at-load-{uuid.uuid4().hex}.bin"
    model = torch_models.save_load_time_helper(tmp_path / "loader.pt", inside)
    with pytest.raises(SandboxFailed) as failed:
        run_in_sandbox({"command": "convert", "kind": "torchscript"}, files={"model": model})
    assert failed.value.code == "forbidden_operator" and "aten::from_file" in str(failed.value), failed.value
    assert "graph" not in str(failed.value)
    from pathlib import Path

    assert not Path(inside).exists()  # the sandbox's /tmp was its own


def test_a_scripted_file_with_branches_gets_the_reason_not_has_been_invalidated(tmp_path):
    model = torch_models.save_scripted_with_branches(tmp_path / "scripted.pt")
    assert scan_torch_file(model).kind == "torchscript"
    with pytest.raises(SandboxFailed) as failed:
        run_in_sandbox({"command": "convert", "kind": "torchscript"}, files={"model": model})
    assert "it was scripted, not traced" in str(failed.value) and "invalidated" not in str(failed.value), failed.value


def test_pytorchs_own_quantized_modules_still_load_their_packed_weights(tmp_path):
    model = torch_models.save_statically_quantized(tmp_path / "quantized.pt")
    assert scan_torch_file(model).kind == "torchscript"
    converted = run_in_sandbox({"command": "convert", "kind": "torchscript", "onnx_out": str(tmp_path / "q.onnx")}, files={"model": model})
    assert "quantized::conv2d" in converted["torch_op_histogram"]


@pytest.mark.parametrize(("call", "named"), [
    ("mystery(state)", "mystery"),
    ("__torch__.elsewhere.run(state)", "__torch__.elsewhere.run"),
    ("(state[0])(1)", "state[0]"),
])
def test_load_time_code_that_calls_what_cannot_be_followed_is_refused_by_name(call, named):
    code = f"""class Packed(Module):
  def forward(self, x):
    return x
  def __setstate__(self, state: Tuple[Tensor]) -> None:
    _0 = {call}
    return None
"""
    with pytest.raises(RefusedTorchFile) as refused:
        check_load_time_code({"code/__torch__/m.py": code})
    assert refused.value.code == "load_time_code" and named in str(refused.value) and "m.Packed.__setstate__" in str(refused.value)


def test_methods_called_on_other_objects_are_followed_whatever_class_they_belong_to():
    code = """class Packed(Module):
  inner : __torch__.m.Inner
  def __setstate__(self, state: Tuple[Tensor]) -> None:
    inner = self.inner
    _0 = (inner).prepare(state)
    return None
class Inner(Module):
  def prepare(self, state: Tuple[Tensor]) -> Tensor:
    return torch.from_file("/etc/shadow", False, 4)
"""
    with pytest.raises(RefusedTorchFile, match=r"with m\.Inner\.prepare\).* calls aten::from_file"):
        check_load_time_code({"code/__torch__/m.py": code})
