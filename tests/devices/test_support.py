"""Operator support from the runtimes' own answers (devices/support.py asks, kiln_contract/operator_support.py shapes the answer, each backend's operator_support)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from devices import support
from devices.backends.onnxruntime import OnnxRuntimeBackend
from kiln_contract import operator_support
from tests.fixtures.models import build_loop_decoder

HAS_OPENVINO = importlib.util.find_spec("openvino") is not None
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def loop_decoder(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("loop") / "decoder.onnx"
    onnx.save(build_loop_decoder(), path)
    return path


def _custom_op_model(path: Path) -> Path:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="relu"), helper.make_node("Foo", ["r"], ["y"], name="custom", domain="com.example")],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)]), path)
    return path


def test_onnx_runtime_places_every_node_of_the_loop_decoder_on_its_cpu_provider(loop_decoder):
    answer = OnnxRuntimeBackend().operator_support(loop_decoder)
    assert answer["verdict"] == operator_support.RUNS and operator_support.runnable(answer)
    # The placement names the model's own nodes, the Loop and its body's included.
    assert answer["native"]["Loop"] == 1 and answer["native"]["SequenceInsert"] == 1 and answer["native"]["MatMul"] == 1
    assert answer["fallback"] == {} and answer["unsupported"] == {}
    assert answer["device"] == "CPUExecutionProvider" and answer["version"]


@pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed")
def test_openvino_cannot_read_the_loop_decoder_and_says_which_loop(loop_decoder):
    from devices.backends.openvino import OpenVinoBackend

    answer = OpenVinoBackend().operator_support(loop_decoder)
    assert answer["verdict"] == operator_support.CANNOT_RUN and not operator_support.runnable(answer)
    assert "cannot read the model" in answer["reason"] and "Loop 'decoder'" in answer["reason"]
    assert answer["unsupported"] == {"Loop": 1}
    # No source locations of OpenVINO's C++ in what the user reads.
    assert "src/" not in answer["reason"] and ".cpp" not in answer["reason"]


def test_an_operator_no_runtime_knows_is_named_by_onnx_runtime(tmp_path):
    answer = OnnxRuntimeBackend().operator_support(_custom_op_model(tmp_path / "custom.onnx"))
    assert answer["verdict"] == operator_support.CANNOT_RUN
    assert answer["unsupported"] == {"Foo": 1} and answer["nodes"]["unsupported"] == ["Foo (com.example)"]


@pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed")
def test_openvino_names_an_operation_it_has_no_conversion_rule_for(tmp_path):
    from devices.backends.openvino import OpenVinoBackend

    answer = OpenVinoBackend().operator_support(_custom_op_model(tmp_path / "custom.onnx"))
    assert answer["verdict"] == operator_support.CANNOT_RUN and "com.example.Foo" in answer["unsupported"]


def test_the_verdict_follows_native_fallback_and_unsupported_nodes():
    base = {"backend": "x", "runtime": "X", "version": "1", "device": "CPU", "source": "test"}
    assert operator_support.answer(**base, native=[("a", "Conv")])["verdict"] == operator_support.RUNS
    partial = operator_support.answer(**base, native=[("a", "Conv")], fallback=[("b", "Softmax"), ("c", "Softmax")])
    assert partial["verdict"] == operator_support.PARTIAL and partial["fallback"] == {"Softmax": 2} and partial["nodes"]["fallback"] == ["b", "c"]
    assert operator_support.runnable(partial) and "2 fall back (Softmax)" in operator_support.summary(partial)
    assert operator_support.answer(**base, native=[("a", "Conv")], unsupported=[("d", "Loop")])["verdict"] == operator_support.CANNOT_RUN
    assert operator_support.answer(**base)["verdict"] == operator_support.UNKNOWN


def test_a_backend_that_is_not_installed_is_answered_unknown(loop_decoder):
    answers = support.check(loop_decoder, ["onnxruntime", "tensorrt"])
    assert [a["backend"] for a in answers] == ["onnxruntime", "tensorrt"]
    assert answers[1]["verdict"] == operator_support.UNKNOWN and "not installed" in answers[1]["reason"]


def test_the_command_line_prints_every_installed_runtimes_answer_as_json(loop_decoder):
    ran = subprocess.run([sys.executable, "-m", "devices.support", str(loop_decoder), "--json"], cwd=REPO, capture_output=True, text=True,
                         timeout=120, check=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    answers = {a["backend"]: a for a in json.loads(ran.stdout)}
    assert answers["onnxruntime"]["verdict"] == operator_support.RUNS
    if HAS_OPENVINO:
        assert answers["openvino"]["verdict"] == operator_support.CANNOT_RUN


class _Silent(OnnxRuntimeBackend):
    name = "silent"

    def operator_support(self, model_path):
        return super(OnnxRuntimeBackend, self).operator_support(model_path)


class _Broken(OnnxRuntimeBackend):
    name = "broken"

    def operator_support(self, model_path):
        raise RuntimeError("the binding fell over")


def test_a_backend_that_cannot_say_or_whose_check_breaks_answers_unknown_and_is_not_ruled_out(loop_decoder):
    silent, broken = support.ask(_Silent(), loop_decoder), support.ask(_Broken(), loop_decoder)
    assert silent["verdict"] == broken["verdict"] == operator_support.UNKNOWN
    assert "cannot report operator support" in silent["reason"] and "the binding fell over" in broken["reason"]
    assert operator_support.runnable(silent) and operator_support.runnable(broken)
