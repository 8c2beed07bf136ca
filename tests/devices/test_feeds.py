"""kiln_contract/feeds.py: layouts told apart by rank, per-sample zips, and sequences run with state carried."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import onnxruntime as ort
import pytest

from devices.agent.runner import evaluate_calls, first_call_feeds, first_samples_outputs
from devices.backends.registry import get_backend
from devices.crosscheck import source_check
from kiln_contract import feeds
from tests.fixtures.feeds_models import MIXED_SIGNATURE, RUNNING_SUM_SIGNATURE, mixed_inputs_model, running_sum_model
from tests.fixtures.models import write_npz
from workers.datasets import inspect_dataset


def arrays(**shapes):
    return {"arrays": {name: {"dtype": dtype, "shape": shape} for name, (dtype, shape) in shapes.items()}}


def session_run(path):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return lambda fed: dict(zip(names, session.run(names, fed)))


def test_rank_tells_batch_first_stacked_and_sequences_apart():
    signature = {"inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 4]}], "outputs": []}
    assert feeds.resolve_plan(arrays(x=("float32", [10, 4])), signature)["mode"] == feeds.BATCH
    assert feeds.resolve_plan(arrays(x=("float32", [10, 1, 4])), signature)["mode"] == feeds.CALLS
    assert feeds.resolve_plan(arrays(x=("float32", [10, 7, 1, 4])), signature)["mode"] == feeds.SEQUENCES


def test_scalar_int64_and_batch_on_axis_one_fit_as_stacked_feeds():
    plan = feeds.resolve_plan(arrays(x=("float32", [5, 2, 1, 3]), n=("int64", [5]), mask=("bool", [5, 1, 3])), MIXED_SIGNATURE)
    assert plan["mode"] == feeds.CALLS and plan["offsets"] == {"x": 1, "n": 1, "mask": 1}


@pytest.mark.parametrize(("dataset", "state", "message"), [
    (arrays(x=("float32", [5, 2, 1, 3]), n=("int64", [5, 1, 1, 1]), mask=("bool", [5, 1, 3])), None, r"rank 4\) but the model input expects rank 0 \[\]: write rank 1 \(one stacked"),
    (arrays(x=("float32", [5, 2, 1, 3]), n=("int64", [5, 1]), mask=("bool", [5, 1, 3])), None, "some arrays are sequences and some are not"),
    (arrays(x=("float32", [5, 2, 1, 3]), n=("int32", [5]), mask=("bool", [5, 1, 3])), None, "int32 but the model input expects int64"),
    (arrays(x=("float32", [5, 3, 1, 3]), n=("int64", [5]), mask=("bool", [5, 1, 3])), None, "size 3 on axis 0"),
    (arrays(x=("float32", [5, 4])), {"hidden": "carry"}, "names output 'hidden', which the model does not have"),
    (arrays(x=("float32", [5, 4])), {"carryN": "carry"}, "needs a dataset of sequences"),
])
def test_what_does_not_fit_is_said_in_words(dataset, state, message):
    signature = RUNNING_SUM_SIGNATURE if state else MIXED_SIGNATURE
    with pytest.raises(feeds.FeedError, match=message):
        feeds.resolve_plan(dataset, signature, state=state)


def test_sequences_carry_state_from_output_to_input(tmp_path):
    model = running_sum_model(tmp_path / "sum.onnx")
    rng = np.random.default_rng(0)
    steps = rng.standard_normal((3, 5, 1, 4)).astype(np.float32)
    data = write_npz(tmp_path / "seq.npz", x=steps)
    plan = feeds.resolve_plan(inspect_dataset(data), RUNNING_SUM_SIGNATURE, state={"carryN": "carry"}, initial_state={"carry": 1.5})
    stack = feeds.OutputStack(["total", "carryN"])
    for sample, step, _, outputs in feeds.iter_calls(session_run(model), data, plan, input_names=["x", "carry"]):
        stack.add(sample, step, outputs)
    expected = 1.5 + np.cumsum(steps, axis=1)  # each sequence starts again from the initial value
    np.testing.assert_allclose(stack.arrays()["total"], expected.reshape(15, 1, 4), atol=1e-5)
    assert stack.steps == [0, 1, 2, 3, 4] * 3


def test_zip_of_samples_with_varying_shapes(tmp_path):
    path = tmp_path / "samples.zip"
    rng = np.random.default_rng(1)
    lengths = [3, 5, 2]
    with zipfile.ZipFile(path, "w") as archive:
        for index, length in enumerate(lengths):
            buffer = io.BytesIO()
            np.savez(buffer, x=rng.standard_normal((length, 1, 4)).astype(np.float32), labels=np.int64(index))
            archive.writestr(f"sample-{index}.npz", buffer.getvalue())
    info = inspect_dataset(path)
    assert info["format"] == feeds.SAMPLES and info["samples"] == 3 and info["has_labels"]
    assert info["arrays"]["x"] == {"dtype": "float32", "shape": [3, None, 1, 4]}
    plan = feeds.resolve_plan(info, RUNNING_SUM_SIGNATURE, state={"carryN": "carry"})
    assert plan["mode"] == feeds.SEQUENCES
    model = running_sum_model(tmp_path / "sum.onnx")
    calls = list(feeds.iter_calls(session_run(model), path, plan, input_names=["x", "carry"]))
    assert [(sample, step) for sample, step, _, _ in calls] == [(s, t) for s, n in enumerate(lengths) for t in range(n)]


def test_pickled_sample_is_refused(tmp_path):
    path = tmp_path / "samples.zip"
    with zipfile.ZipFile(path, "w") as archive:
        buffer = io.BytesIO()
        np.savez(buffer, x=np.array([object()], dtype=object))
        archive.writestr("sample-0.npz", buffer.getvalue())
    with zipfile.ZipFile(path) as archive, pytest.raises(feeds.FeedError, match="not an .npz of numeric arrays"):
        feeds.load_sample(archive, "sample-0.npz")


def test_agent_evaluates_sequences_call_by_call_with_per_step_figures(tmp_path):
    model = running_sum_model(tmp_path / "sum.onnx")
    steps = np.random.default_rng(2).standard_normal((4, 6, 1, 4)).astype(np.float32)
    data = write_npz(tmp_path / "seq.npz", x=steps)
    plan = feeds.resolve_plan(inspect_dataset(data), RUNNING_SUM_SIGNATURE, state={"carryN": "carry"})
    totals = np.cumsum(steps, axis=1).reshape(24, 1, 4)
    reference = {"total": totals, "carryN": totals.copy()}
    reference["total"][5::6] += 1.0  # the last step of every sequence disagrees with the device
    compiled = get_backend("onnxruntime").compile(model, tmp_path / "compiled", threads=1)
    try:
        assert set(first_call_feeds(compiled, data, plan)) == {"x", "carry"}
        accuracy = evaluate_calls(compiled, data, plan, reference, None)
    finally:
        compiled.close()
    assert accuracy["calls"] == 24 and accuracy["sequences"] == 4
    errors = [row["outputs"]["total"]["max_abs_error"] for row in accuracy["per_step"]]
    assert errors[:5] == pytest.approx([0.0] * 5, abs=1e-6) and errors[5] == pytest.approx(1.0, abs=1e-5)
    assert all(row["outputs"]["carryN"]["max_abs_error"] < 1e-5 for row in accuracy["per_step"])


def test_the_self_check_of_sequences_runs_the_first_samples_call_by_call_against_the_same_rows_of_the_reference(tmp_path):
    model = running_sum_model(tmp_path / "sum.onnx")
    steps = np.random.default_rng(4).standard_normal((4, 6, 1, 4)).astype(np.float32)
    data = write_npz(tmp_path / "seq.npz", x=steps)
    plan = feeds.resolve_plan(inspect_dataset(data), RUNNING_SUM_SIGNATURE, state={"carryN": "carry"})
    totals = np.cumsum(steps, axis=1).reshape(24, 1, 4)
    compiled = get_backend("onnxruntime").compile(model, tmp_path / "compiled", threads=1)
    try:
        outputs, samples = first_samples_outputs(compiled, None, data, plan, 2)
    finally:
        compiled.close()
    # Two sequences of six calls, state carried: the reference's first twelve rows, in the reference's order.
    assert samples == 2 and outputs["total"].shape == (12, 1, 4)
    np.testing.assert_allclose(outputs["total"], totals[:12], atol=1e-5)
    check = source_check(outputs, {"total": totals, "carryN": totals}, model, backend_name="litert", samples=samples)
    assert check["samples"] == 2 and check["min_cosine"] > 0.9999 and set(check["cosine"]) == {"total", "carryN"}


def test_stacked_int_and_bool_inputs_keep_their_dtypes_through_the_agent(tmp_path):
    model = mixed_inputs_model(tmp_path / "mixed.onnx")
    rng = np.random.default_rng(3)
    data = write_npz(tmp_path / "mixed.npz", x=rng.standard_normal((6, 2, 1, 3)).astype(np.float32),
                     n=rng.integers(1, 5, 6).astype(np.int64), mask=rng.integers(0, 2, (6, 1, 3)).astype(bool))
    plan = feeds.resolve_plan(inspect_dataset(data), MIXED_SIGNATURE)
    run = session_run(model)
    stack = feeds.OutputStack(["scaled", "kept"])
    for sample, step, fed, outputs in feeds.iter_calls(run, data, plan, input_names=["x", "n", "mask"]):
        assert fed["n"].dtype == np.int64 and fed["n"].shape == () and fed["mask"].dtype == np.bool_
        stack.add(sample, step, outputs)
    reference = stack.arrays()
    assert reference["kept"].dtype == np.int64 and reference["kept"].shape == (6,)
    compiled = get_backend("onnxruntime").compile(model, tmp_path / "compiled", threads=1)
    try:
        accuracy = evaluate_calls(compiled, data, plan, reference, None)
    finally:
        compiled.close()
    assert accuracy["calls"] == 6 and "per_step" not in accuracy


def test_the_agent_reads_attention_masks_call_by_call(tmp_path, masked_encoder_case):
    files, evaluation, inputs, reference = masked_encoder_case
    (tmp_path / "encoder.onnx").write_bytes(files["model"])
    path = tmp_path / "samples.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for index in range(3):
            buffer = io.BytesIO()
            np.savez(buffer, **{name: value[index] for name, value in inputs.items()})
            archive.writestr(f"sample-{index}.npz", buffer.getvalue())
    signature = {"inputs": [{"name": "input", "dtype": "float32", "shape": ["batch", 6, 8]},
                            {"name": "attention_mask", "dtype": "int64", "shape": ["batch", 6]}], "outputs": []}
    plan = feeds.resolve_plan(inspect_dataset(path), signature)
    assert feeds.needs_calls(plan)
    by_call = {name: value[:, None] for name, value in reference.items()}  # one [1, T, H] output per call
    compiled = get_backend("onnxruntime").compile(tmp_path / "encoder.onnx", tmp_path / "compiled", threads=1)
    try:
        accuracy = evaluate_calls(compiled, path, plan, by_call, evaluation)
    finally:
        compiled.close()
    hidden = accuracy["outputs"]["last_hidden_state"]
    assert hidden["errors"] == {} and hidden["metrics"]["kept_tokens"] == 12 and hidden["metrics"]["max_abs_error"] < 1e-5
