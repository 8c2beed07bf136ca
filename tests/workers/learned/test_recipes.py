"""Learned rounding: where calibrated INT8 misses 1% through weight rounding, the learned variant meets it,
measured again from its file, with the calibrated variant's graph (so its speed), in bounded time."""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest

from kiln_contract import metrics
from tests.fixtures.models import write_npz
from tests.fixtures.rounding import build_rounding_sensitive_mlp, rounding_inputs
from tests.workers.helpers import run_on_device_backend
from workers.quantize import NotApplicable, build_variant

pytestmark = pytest.mark.timeout(300)
CALIBRATED = {"calibration_method": "mse", "per_channel": True}


@pytest.fixture(scope="module")
def rounding_case(tmp_path_factory):
    root = tmp_path_factory.mktemp("rounding")
    model = root / "model.onnx"
    onnx.save(build_rounding_sensitive_mlp(), model)
    calibration = write_npz(root / "calibration.npz", input=rounding_inputs(samples=128, seed=1))
    validation = rounding_inputs(samples=64, seed=2)
    return {"root": root, "model": model, "calibration": calibration, "validation": validation}


def op_types(path) -> Counter:
    return Counter(node.op_type for node in onnx.load(str(path)).graph.node)


def test_learned_rounding_meets_the_tolerance_calibrated_int8_misses(rounding_case):
    root = rounding_case["root"]
    calibrated, learned = root / "calibrated.onnx", root / "learned.onnx"
    build_variant(model_path=rounding_case["model"], precision="int8", out_path=calibrated, calibration_path=rounding_case["calibration"], options=CALIBRATED)
    built = build_variant(model_path=rounding_case["model"], precision="int8", out_path=learned, calibration_path=rounding_case["calibration"],
                          options={**CALIBRATED, "learn": "adaround", "learn_seconds": 30})
    reference = run_on_device_backend(rounding_case["model"], rounding_case["validation"])
    calibrated_cosine = metrics.cosine_similarity(run_on_device_backend(calibrated, rounding_case["validation"]), reference)
    learned_cosine = metrics.cosine_similarity(run_on_device_backend(learned, rounding_case["validation"]), reference)
    assert calibrated_cosine < 0.99, calibrated_cosine
    assert learned_cosine >= 0.99, (learned_cosine, built["recipe"]["learned"]["layers"])
    # The same operators as calibrated INT8: only integer weights changed, so it runs at INT8 speed.
    assert op_types(learned) == op_types(calibrated)
    learned_recipe = built["recipe"]["learned"]
    assert learned_recipe["method"] == "adaround" and learned_recipe["seconds"] <= 30 + 5
    first = learned_recipe["layers"][0]
    assert first["mse_learned"] < first["mse_nearest"] / 2 and first["steps"] > 10
    # The curve starts at rounding to nearest (relative loss 1) and ends well below it.
    assert len(first["curve"]) >= 10 and first["curve"][-1] < first["curve"][0] / 2
    assert learned_recipe["curve"][0] == pytest.approx(1.0, rel=0.5)


def test_learning_stops_at_its_time_budget_and_keeps_a_bounded_curve(rounding_case):
    out = rounding_case["root"] / "short.onnx"
    built = build_variant(model_path=rounding_case["model"], precision="int8", out_path=out, calibration_path=rounding_case["calibration"],
                          options={**CALIBRATED, "learn": "adaround", "learn_seconds": 1, "learn_memory_mb": 1})
    learned = built["recipe"]["learned"]
    assert learned["seconds"] < 1 + 4
    # One megabyte holds 64 + 64 + 16 floats per sample a few thousand times, never the 256 asked for past the data.
    assert 1 <= learned["samples"] <= 256
    assert all(len(layer["curve"]) <= 60 for layer in learned["layers"])
    assert learned["peak_rss_mb"] > 0


def test_convolutions_with_a_folded_relu_are_learned(digits_path, digits_calibration, tmp_path):
    out = tmp_path / "digits-learned.onnx"
    built = build_variant(model_path=digits_path, precision="int8", out_path=out, calibration_path=digits_calibration,
                          options={**CALIBRATED, "learn": "adaround", "learn_seconds": 3})
    layers = built["recipe"]["learned"]["layers"]
    assert len(layers) == 3, built["recipe"]["learned"]
    # Both convolutions compute their folded Relu in the learner: rounding to nearest reproduces FP32 closely.
    assert all(layer["mse_learned"] <= layer["mse_nearest"] for layer in layers)


def test_a_model_without_quantized_weights_is_not_applicable(tmp_path):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["input"], ["output"])], "relu",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "relu.onnx"
    onnx.save(model, path)
    calibration = write_npz(tmp_path / "calibration.npz", input=np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32))
    with pytest.raises(NotApplicable, match="nothing to learn"):
        build_variant(model_path=path, precision="int8", out_path=tmp_path / "out.onnx", calibration_path=calibration,
                      options={**CALIBRATED, "learn": "adaround", "learn_seconds": 1})
