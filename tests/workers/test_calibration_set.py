"""Calibration samples chosen by count and seed (stratified by label), and the calls written for them."""

from __future__ import annotations

import numpy as np
import pytest

from kiln_contract import feeds
from tests.fixtures.feeds_models import RUNNING_SUM_SIGNATURE, running_sum_model
from tests.fixtures.models import write_npz
from workers.calibration_set import choose_samples, write_calibration_calls
from workers.datasets import dataset_samples, inspect_dataset, iter_batches


@pytest.fixture
def labelled(tmp_path):
    labels = np.array([0] * 60 + [1] * 30 + [2] * 10, np.int64)
    x = np.arange(100, dtype=np.float32)[:, None].repeat(4, axis=1)
    return write_npz(tmp_path / "labelled.npz", x=x, labels=labels), labels


def test_stratified_subset_keeps_each_labels_share_and_repeats_for_a_seed(labelled):
    path, labels = labelled
    chosen = choose_samples(path, count=20, seed=7)
    assert chosen["stratified"] and chosen["by_label"] == {"0": 12, "1": 6, "2": 2}
    assert [labels[i] for i in chosen["indices"]].count(2) == 2
    assert choose_samples(path, count=20, seed=7)["indices"] == chosen["indices"]
    assert choose_samples(path, count=20, seed=8)["indices"] != chosen["indices"]
    plain = choose_samples(path, count=20, seed=7, stratify=False)
    assert not plain["stratified"] and plain["by_label"] is None and len(set(plain["indices"])) == 20


def test_calls_of_a_subset_are_exactly_the_chosen_samples(labelled, tmp_path):
    path, _ = labelled
    model = running_sum_model(tmp_path / "sum.onnx")
    signature = {"inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 4]}, {"name": "carry", "dtype": "float32", "shape": ["batch", 4]}],
                 "outputs": []}
    data = write_npz(tmp_path / "x.npz", x=np.load(path)["x"], carry=np.zeros((100, 4), np.float32))
    plan = feeds.resolve_plan(inspect_dataset(data), signature)
    chosen = choose_samples(path, count=5, seed=1)
    out = tmp_path / "calls.zip"
    assert write_calibration_calls(model, data, plan, out, indices=chosen["indices"]) == {"samples": 5, "calls": 5}
    assert dataset_samples(out) == 5
    served = [batch["x"][0, 0] for batch in iter_batches(out, input_names=["x", "carry"], batch_size=16)]
    assert served == [float(i) for i in chosen["indices"]]


def test_state_inputs_are_calibrated_with_the_values_fp32_carries(tmp_path):
    model = running_sum_model(tmp_path / "sum.onnx")
    steps = np.random.default_rng(0).standard_normal((2, 3, 1, 4)).astype(np.float32)
    data = write_npz(tmp_path / "seq.npz", x=steps)
    plan = feeds.resolve_plan(inspect_dataset(data), RUNNING_SUM_SIGNATURE, state={"carryN": "carry"})
    out = tmp_path / "calls.zip"
    assert write_calibration_calls(model, data, plan, out) == {"samples": 2, "calls": 6}
    calls = list(iter_batches(out, input_names=["x", "carry"], batch_size=8))
    carried = np.stack([call["carry"] for call in calls]).reshape(2, 3, 1, 4)
    # The state fed at step t is the sum of steps before t: zero first, then FP32's running total.
    expected = np.concatenate([np.zeros((2, 1, 1, 4), np.float32), np.cumsum(steps, axis=1)[:, :-1]], axis=1)
    np.testing.assert_allclose(carried, expected, atol=1e-5)


def test_static_int8_calibrates_a_stateful_model_with_a_scalar_input_from_its_calls(tmp_path):
    from tests.fixtures.zoo import SILERO_VAD
    from workers.quantize import build_variant

    if SILERO_VAD.path is None:
        pytest.skip("silero-vad is not installed (it is in the dev extra)")
    data = write_npz(tmp_path / "vad.npz", **SILERO_VAD.sequences(4, 5, seed=0))
    # The scalar first: each call's feeds then lead with a tensor that has no rows to count.
    signature = {"inputs": [{"name": "sr", "dtype": "int64", "shape": []},
                            {"name": "state", "dtype": "float32", "shape": [2, "batch", 128]},
                            {"name": "input", "dtype": "float32", "shape": ["batch", "sequence"]}],
                 "outputs": [{"name": "output", "dtype": "float32", "shape": ["batch", 1]}, {"name": "stateN", "dtype": "float32", "shape": None}]}
    plan = feeds.resolve_plan(inspect_dataset(data), signature, state=SILERO_VAD.state)
    calls = write_calibration_calls(SILERO_VAD.path, data, plan, tmp_path / "calls.zip")
    built = build_variant(model_path=SILERO_VAD.path, precision="int8", out_path=tmp_path / "int8.onnx",
                          calibration_path=tmp_path / "calls.zip", options={})
    assert built["recipe"]["samples"] == calls["calls"] == 20
