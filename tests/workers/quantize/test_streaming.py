"""Calibration streamed within the build memory budget: the ranges are exactly those of a pass over everything at once,
and a model whose samples x activations would not fit a small budget calibrates within it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.fixtures.budget import run_under_budget
from tests.fixtures.models import write_npz
from workers.quantize import streaming
from workers.quantize.calibration_methods import calibrate
from workers.quantize.isolated import build_isolated
from workers.quantize.ort_calibration import ort_calibration_tensors, ort_ranges
from workers.quantize.streaming import ActivationStream, CalibrationMemoryError

ORT_METHODS = ("MinMax", "Entropy", "Percentile", "Distribution")


def _chain_model(*, channels: int, side: int, depth: int) -> onnx.ModelProto:
    """A convolution, then `depth` elementwise steps, each a new [N, channels, side, side] activation: many large tensors."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array((rng.standard_normal((channels, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["t0"], pads=[1, 1, 1, 1])]
    initializers = [weight]
    steps = ("Relu", "Mul", "Sigmoid", "Add", "Tanh")
    for index in range(depth):
        op = steps[index % len(steps)]
        inputs = [f"t{index}"]
        if op in ("Mul", "Add"):
            name = f"c{index}"
            initializers.append(numpy_helper.from_array(np.array(1.5 if op == "Mul" else -0.25, np.float32), name))
            inputs.append(name)
        nodes.append(helper.make_node(op, inputs, [f"t{index + 1}"]))
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, side, side])],
        [helper.make_tensor_value_info(f"t{depth}", TensorProto.FLOAT, ["N", channels, side, side])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def small_chain(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("chain")
    model = folder / "chain.onnx"
    onnx.save(_chain_model(channels=8, side=32, depth=7), str(model))
    # Heavy tails, so that the histogram methods clip differently from MinMax.
    samples = np.random.default_rng(1).standard_t(3, (21, 3, 32, 32)).astype(np.float32)
    return model, write_npz(folder / "calibration.npz", x=samples)


def _tight(stream: ActivationStream) -> int:
    """An allowance that takes the reductions one sample at a time and the histograms one sample and four or five of
    the 32 KB tensors at a time, whatever the session's measured working set on this machine."""
    return stream.working_set_bytes + 24 * 8 * 32 * 32 + 150_000


def _onnxruntime_ranges(model: Path, calibration: Path, method: str, folder: Path) -> dict[str, tuple[float, float]]:
    """onnxruntime's own calibrator for `method`, handed every sample (what quantize_static did before streaming)."""
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator

    from workers.quantize.calibration import NpzCalibrationReader

    calibrator = create_calibrator(model, None, augmented_model_path=str(folder / f"{method}.onnx"),
                                   calibrate_method=getattr(CalibrationMethod, method))
    # Its histogram calibrators stack the batches and need them of one size (Kiln fed them one sample at a time).
    calibrator.collect_data(NpzCalibrationReader(calibration, input_names=["x"], batch_size=4 if method == "MinMax" else 1))
    return {name: _pair(data) for name, data in calibrator.compute_data().items()}


def _pair(data) -> tuple[float, float]:
    return float(np.asarray(data.range_value[0]).reshape(-1)[0]), float(np.asarray(data.range_value[1]).reshape(-1)[0])


@pytest.mark.parametrize("method", ORT_METHODS)
def test_onnxruntime_methods_streamed_give_exactly_onnxruntimes_ranges(small_chain, method, tmp_path, monkeypatch):
    model, calibration = small_chain
    expected = _onnxruntime_ranges(model, calibration, method, tmp_path)
    monkeypatch.setattr(ActivationStream, "_allowance", _tight)
    ranges, stream = ort_ranges(model, calibration, method=method, limit=21, batch_size=16)
    assert {name: _pair(data) for name, data in ranges.items()} == expected
    assert stream.plan["reduce_batch"] == 1
    if method != "MinMax":
        assert stream.plan["histogram_batch"] == 1 and stream.plan["groups"] > 1


def test_onnxruntime_tensor_choice_follows_op_types(small_chain):
    model, _ = small_chain
    assert set(ort_calibration_tensors(model, None)) == {"x", "w", *{f"t{index}" for index in range(8)}} - {"w"}
    # Only the inputs and outputs of the Conv: what quantize_static calibrates for op_types_to_quantize=["Conv"].
    assert set(ort_calibration_tensors(model, ["Conv"])) == {"x", "t0"}


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy", "mse"])
def test_kilns_methods_give_the_same_ranges_whatever_the_budget_lets_through(small_chain, method, monkeypatch):
    model, calibration = small_chain
    roomy = calibrate(model, calibration, method=method, batch_size=16)
    monkeypatch.setattr(ActivationStream, "_allowance", _tight)
    tight = calibrate(model, calibration, method=method, batch_size=16)
    assert tight.ranges == roomy.ranges and tight.rules == roomy.rules
    assert tight.samples == roomy.samples == 21
    assert tight.streaming["reduce_batch"] == 1 < roomy.streaming["reduce_batch"]
    if method != "minmax":
        assert tight.streaming["groups"] > 1 == roomy.streaming["groups"]


def test_a_sample_that_cannot_fit_says_what_it_needs_and_what_budget_would_fit(small_chain, monkeypatch):
    model, calibration = small_chain
    monkeypatch.setattr(streaming, "memory_allowance_bytes", lambda budget_mb=None: 1_000)
    with pytest.raises(CalibrationMemoryError, match=r"mse calibration needs about \d+ MB for the reductions of one "
                       r"calibration sample.*build memory budget is \d+ MB \(KILN_BUILD_MEMORY_MB\)\. A budget of \d+ MB would fit"):
        calibrate(model, calibration, method="mse")


def test_streaming_checks_the_calibration_data(small_chain, tmp_path):
    model, _ = small_chain
    bad = np.zeros((8, 3, 32, 32), np.float32)
    bad[5, 0, 0, 0] = np.nan
    path = write_npz(tmp_path / "nan.npz", x=bad)
    with ActivationStream(model, ["t1"]) as stream, pytest.raises(ValueError, match="contains NaN or Inf .first at sample 5"):
        stream.reduce(path, limit=8)


# A model whose activations of 48 samples (what onnxruntime's histogram calibrators hold at once) are about 1.5 GB,
# 33 MB a sample, against a 640 MB budget.
BIG = {"channels": 16, "side": 128, "depth": 32}
BUDGET_MB = 640


@pytest.fixture(scope="module")
def big_chain(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("big-chain")
    model = folder / "big.onnx"
    onnx.save(_chain_model(**BIG), str(model))
    samples = np.random.default_rng(2).standard_normal((48, 3, BIG["side"], BIG["side"])).astype(np.float32)
    return model, write_npz(folder / "calibration.npz", x=samples)


def test_histogram_calibration_of_large_activations_fits_a_budget_that_onnxruntimes_own_calibrator_exceeds(big_chain, tmp_path):
    model, calibration = big_chain
    onnxruntime_own = f"""
        import sys
        from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator
        from workers.quantize.calibration import NpzCalibrationReader
        calibrator = create_calibrator({str(model)!r}, None, augmented_model_path="augmented.onnx",
                                       calibrate_method=CalibrationMethod.Entropy)
        calibrator.collect_data(NpzCalibrationReader({str(calibration)!r}, input_names=["x"], batch_size=1))
        calibrator.compute_data()
    """
    stopped, _, _ = run_under_budget(onnxruntime_own, BUDGET_MB, tmp_path)
    assert stopped, "onnxruntime's entropy calibrator held every sample's activations and should not fit"

    streamed = f"""
        import json, sys
        import numpy as np
        from workers.quantize.ort_calibration import ort_ranges
        ranges, stream = ort_ranges({str(model)!r}, {str(calibration)!r}, method="Entropy", limit=48)
        pairs = {{name: [float(np.asarray(v).reshape(-1)[0]) for v in data.range_value] for name, data in ranges.items()}}
        json.dump({{"ranges": pairs, "plan": stream.plan}}, open(sys.argv[1], "w"))
    """
    stopped, peak_mb, result = run_under_budget(streamed, BUDGET_MB, tmp_path)
    assert not stopped and peak_mb < BUDGET_MB
    outcome = json.loads(result.read_text())
    # The same ranges as onnxruntime's calibrator given all the memory it wants (here, in this process).
    expected = _onnxruntime_ranges(model, calibration, "Entropy", tmp_path)
    assert {name: tuple(pair) for name, pair in outcome["ranges"].items()} == expected
    assert outcome["plan"]["histogram_batch"] < 16


# It peaks at 500-516 MB of the 640 (AVX2 EPYC, 2026-12-07). It went past 640 in CI twice, at random: each trim of the
# allocator started ldconfig, gcc and ld (ctypes.util.find_library), and the sandbox's watch added each vforked child's
# memory, its parent's, to its parent's (test_returning_free_memory_starts_no_process; tests/workers/sandbox/test_limits.py).
def test_a_static_int8_build_of_large_activations_fits_the_small_budget_and_says_how_it_streamed(big_chain, tmp_path):
    model, calibration = big_chain
    for method in ("minmax", "mse"):
        built = build_isolated(model_path=model, precision="int8", out_path=tmp_path / f"{method}.onnx", calibration_path=calibration,
                               options={"calibration_method": method, "per_channel": False}, memory_budget=BUDGET_MB)
        assert built["peak_rss_mb"] < BUDGET_MB
        assert built["recipe"]["samples"] == 48
        assert 1 <= built["recipe"]["calibration_streaming"]["reduce_batch"] < 16


def test_tensors_that_must_come_together_share_a_group_when_one_sample_is_streamed_in_groups(small_chain, monkeypatch):
    model, calibration = small_chain
    names = [f"t{index}" for index in range(8)]
    with ActivationStream(model, names, batch_size=4) as stream:
        stream.reduce(calibration, limit=20)
        monkeypatch.setattr(stream, "_allowance", lambda: _tight(stream))
        # t1 with t6, and t6 with t3 (overlapping units are one): what a node's several activation inputs ask.
        groups = [group for group, _ in stream.groups(calibration, limit=20, units=[["t1", "t6"], ["t6", "t3"]])]
    assert len(groups) > 1, "the tight allowance should stream in groups"
    assert sorted(name for group in groups for name in group) == sorted(names)
    together = next(group for group in groups if "t1" in group)
    assert {"t1", "t3", "t6"} <= set(together)


def test_returning_free_memory_starts_no_process(monkeypatch):
    """Streaming trims the C allocator after each pass, holding most of its budget: a process started then (a vfork, its
    memory its parent's until the exec) counted the build's memory twice (see tests/workers/sandbox/test_limits.py)."""
    import subprocess

    def refuse(*args, **kwargs):
        raise AssertionError(f"a process was started: {args[:1]}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    streaming.release_free_memory()
