"""The runtime self-check: a runtime that disagrees with its reference (ONNX Runtime on the same file, or the FP32 source
for a file ONNX Runtime cannot read) far beyond quantization noise is at fault, not the variant."""

from __future__ import annotations

import importlib.util

import numpy as np
import onnx
import pytest

from devices.artifacts import pack_openvino_ir
from devices.crosscheck import FAULT_COSINE, FLOAT_SOURCE, REFERENCE_BACKEND, RuntimeFault, applies, cross_check, reference_for, source_check
from tests.devices.conftest import reference_logits

needs_openvino = pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="openvino is not installed")
FEEDS = {"input": np.random.default_rng(7).standard_normal((4, 1, 8, 8)).astype(np.float32)}


class Misreading:
    """A compiled model whose runtime misreads the file: its outputs are another model's (here, negated)."""

    def __init__(self, compiled):
        self.compiled = compiled

    def run(self, feeds):
        return {name: -value for name, value in self.compiled.run(feeds).items()}


def test_each_artifact_is_checked_against_the_reference_it_has(tiny_model_path, tmp_path):
    assert applies("openvino", tiny_model_path) and applies("litert", tiny_model_path)
    assert reference_for("openvino", tiny_model_path) == REFERENCE_BACKEND
    assert not applies("onnxruntime", tiny_model_path) and reference_for("onnxruntime", tiny_model_path) is None
    # Files ONNX Runtime cannot read are checked against their FP32 source, not run on ONNX Runtime.
    (tmp_path / "m.xml").write_text("<net/>")
    (tmp_path / "m.bin").write_bytes(b"\0")
    ir = pack_openvino_ir(tmp_path / "m.xml", tmp_path / "m.bin", tmp_path / "ir.tar")
    flatbuffer = tmp_path / "m.tflite"
    flatbuffer.write_bytes(b"\0\0\0\0TFL3" + b"\0" * 64)
    assert not applies("openvino", ir) and reference_for("openvino", ir) == FLOAT_SOURCE
    assert reference_for("litert", flatbuffer) == FLOAT_SOURCE


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


def _ir_outputs(tiny_ir_path, tmp_path):
    from devices.backends.openvino import OpenVinoBackend

    compiled = OpenVinoBackend().compile(tiny_ir_path, tmp_path / "ir", threads=1)
    try:
        return compiled.run(FEEDS)
    finally:
        compiled.close()


@needs_openvino
def test_an_ir_that_computes_its_fp32_source_passes_against_the_reference_outputs(tiny_ir_path, tiny_model_path, tmp_path):
    reference = {"logits": reference_logits(tiny_model_path, np.concatenate([FEEDS["input"]] * 2))}  # the whole validation set
    check = source_check(_ir_outputs(tiny_ir_path, tmp_path), reference, tiny_ir_path, backend_name="openvino", precision="fp32", samples=4)
    assert check["against"] == FLOAT_SOURCE and check["samples"] == 4 and check["fault"] is False
    assert check["min_cosine"] > 0.999 and set(check["cosine"]) == {"logits"}


@needs_openvino
def test_an_ir_far_from_its_fp32_source_is_a_runtime_fault_that_names_what_was_compared(tiny_ir_path, tiny_model_path, tmp_path):
    reference = {"logits": reference_logits(tiny_model_path, FEEDS["input"])}
    misread = {name: -value for name, value in _ir_outputs(tiny_ir_path, tmp_path).items()}
    with pytest.raises(RuntimeFault) as raised:
        source_check(misread, reference, tiny_ir_path, backend_name="openvino", precision="int8", samples=4)
    assert str(raised.value).startswith("runtime fault: openvino INT8 IR disagrees with its FP32 source on ONNX Runtime: cosine -1.000 "
                                        "on output 'logits'")
    assert raised.value.check["fault"] is True and raised.value.check["against"] == FLOAT_SOURCE


def test_quantization_noise_is_no_fault_and_outputs_the_reference_lacks_give_no_verdict(tmp_path):
    flatbuffer = tmp_path / "m.tflite"
    flatbuffer.write_bytes(b"\0\0\0\0TFL3" + b"\0" * 64)
    expected = np.random.default_rng(3).standard_normal((8, 10)).astype(np.float32)
    noisy = expected[:4] + 0.3 * np.random.default_rng(4).standard_normal((4, 10)).astype(np.float32)
    check = source_check({"logits": noisy}, {"logits": expected}, flatbuffer, backend_name="litert", samples=4)
    assert FAULT_COSINE < check["min_cosine"] < 0.99 and check["fault"] is False
    assert source_check({"other": noisy}, {"logits": expected}, flatbuffer, backend_name="litert", samples=4) is None
