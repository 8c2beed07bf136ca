"""The runtime self-check: a runtime that disagrees with ONNX Runtime on the same file is at fault, not the variant."""

from __future__ import annotations

import importlib.util

import numpy as np
import onnx
import pytest

from devices.artifacts import pack_openvino_ir
from devices.crosscheck import FAULT_COSINE, RuntimeFault, applies, cross_check

needs_openvino = pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="openvino is not installed")
FEEDS = {"input": np.random.default_rng(7).standard_normal((4, 1, 8, 8)).astype(np.float32)}


class Misreading:
    """A compiled model whose runtime misreads the file: its outputs are another model's (here, negated)."""

    def __init__(self, compiled):
        self.compiled = compiled

    def run(self, feeds):
        return {name: -value for name, value in self.compiled.run(feeds).items()}


def test_only_other_runtimes_on_files_onnx_runtime_reads_are_checked(tiny_model_path, tmp_path):
    assert applies("openvino", tiny_model_path) and applies("litert", tiny_model_path)
    assert not applies("onnxruntime", tiny_model_path)
    (tmp_path / "m.xml").write_text("<net/>")
    (tmp_path / "m.bin").write_bytes(b"\0")
    assert not applies("openvino", pack_openvino_ir(tmp_path / "m.xml", tmp_path / "m.bin", tmp_path / "ir.tar"))


@needs_openvino
def test_openvino_agrees_with_onnx_runtime_on_the_same_file(tiny_model_path, tmp_path):
    from devices.backends.openvino import OpenVinoBackend

    compiled = OpenVinoBackend().compile(tiny_model_path, tmp_path / "ov", threads=1)
    try:
        check = cross_check(compiled, tiny_model_path, FEEDS, backend_name="openvino")
    finally:
        compiled.close()
    assert check["against"] == "onnxruntime" and check["samples"] == 4
    assert check["fault"] is False and check["min_cosine"] > 0.999 and set(check["cosine"]) == {"logits"}


@needs_openvino
def test_a_runtime_that_misreads_the_file_is_a_runtime_fault(tiny_model_path, tmp_path):
    from devices.backends.openvino import OpenVinoBackend

    compiled = OpenVinoBackend().compile(tiny_model_path, tmp_path / "ov", threads=1)
    try:
        with pytest.raises(RuntimeFault, match="runtime fault: openvino and onnxruntime disagree") as raised:
            cross_check(Misreading(compiled), tiny_model_path, FEEDS, backend_name="openvino")
    finally:
        compiled.close()
    assert raised.value.check["fault"] is True and raised.value.check["min_cosine"] < FAULT_COSINE


def test_a_file_onnx_runtime_cannot_run_gives_no_verdict(tmp_path):
    broken = tmp_path / "custom.onnx"
    node = onnx.helper.make_node("NoSuchOp", ["input"], ["logits"], domain="example.custom")
    graph = onnx.helper.make_graph([node], "g", [onnx.helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, [4, 1, 8, 8])],
                                   [onnx.helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, None)])
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("example.custom", 1)]),
              str(broken))
    assert cross_check(object(), broken, FEEDS, backend_name="openvino") is None
