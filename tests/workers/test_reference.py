"""compute_reference_outputs on the digits CNN, in batches and with a static batch of 1."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fixtures.models import save_with_static_batch, write_npz
from tests.workers.helpers import run_model
from workers.datasets import InvalidDataset
from workers.reference import compute_reference_outputs


def test_reference_outputs_match_a_full_run(digits, digits_path, digits_validation, tmp_path):
    out = tmp_path / "ref" / "reference.npz"
    result = compute_reference_outputs(digits_path, digits_validation, out, batch_size=50)
    samples = len(digits.x_val)
    assert result == {"samples": samples, "outputs": {"logits": [samples, 10]}}
    with np.load(out, allow_pickle=False) as written:
        assert written.files == ["logits"]
        np.testing.assert_allclose(written["logits"], run_model(digits_path, {"input": digits.x_val})[0], atol=1e-5)
    assert [p.name for p in out.parent.iterdir()] == ["reference.npz"]


def test_static_batch_one_model_runs_sample_by_sample(digits, tmp_path):
    path = save_with_static_batch(digits.model, tmp_path / "b1.onnx", 1)
    data = write_npz(tmp_path / "v.npz", input=digits.x_val[:7])
    result = compute_reference_outputs(path, data, tmp_path / "r.npz", batch_size=32)
    assert result["outputs"] == {"logits": [7, 10]}
    with np.load(tmp_path / "r.npz") as written:
        expected = np.concatenate([run_model(path, {"input": digits.x_val[i : i + 1]})[0] for i in range(7)])
        np.testing.assert_allclose(written["logits"], expected, atol=1e-6)


def test_static_batch_larger_than_one_pads_the_last_batch(digits, tmp_path):
    path = save_with_static_batch(digits.model, tmp_path / "b4.onnx", 4)
    data = write_npz(tmp_path / "v.npz", input=digits.x_val[:10])
    result = compute_reference_outputs(path, data, tmp_path / "r.npz")
    assert result["samples"] == 10 and result["outputs"] == {"logits": [10, 10]}
    with np.load(tmp_path / "r.npz") as written:
        np.testing.assert_allclose(written["logits"][8:], run_model(path, {"input": digits.x_val[[8, 9, 9, 9]]})[0][:2], atol=1e-6)


def test_dataset_without_the_model_input_fails(digits_path, tmp_path):
    data = write_npz(tmp_path / "v.npz", pixels=np.zeros((3, 1, 8, 8), np.float32))
    with pytest.raises(InvalidDataset, match="'input'"):
        compute_reference_outputs(digits_path, data, tmp_path / "r.npz")
    assert not (tmp_path / "r.npz").exists()


def test_stacked_feeds_keep_int_and_bool_dtypes_and_scalars(tmp_path):
    from kiln_contract.feeds import resolve_plan
    from tests.fixtures.feeds_models import MIXED_SIGNATURE, mixed_inputs_model
    from workers.datasets import inspect_dataset

    model = mixed_inputs_model(tmp_path / "mixed.onnx")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 2, 1, 3)).astype(np.float32)
    n = rng.integers(1, 9, 4).astype(np.int64)
    mask = rng.integers(0, 2, (4, 1, 3)).astype(bool)
    data = write_npz(tmp_path / "mixed.npz", x=x, n=n, mask=mask)
    plan = resolve_plan(inspect_dataset(data), MIXED_SIGNATURE)
    result = compute_reference_outputs(model, data, tmp_path / "r.npz", plan=plan)
    assert result["outputs"] == {"scaled": [4, 2, 1, 3], "kept": [4]}
    with np.load(tmp_path / "r.npz", allow_pickle=False) as written:
        assert written["kept"].dtype == np.int64
        np.testing.assert_array_equal(written["kept"], mask.reshape(4, -1).sum(axis=1))
        np.testing.assert_allclose(written["scaled"], np.where(mask[:, None], x * n[:, None, None, None], 0), rtol=1e-6)
