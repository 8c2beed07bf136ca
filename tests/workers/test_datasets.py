"""inspect_npz, check_dataset_against_signature and iter_batches on real and broken datasets."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fixtures.models import write_npz
from workers.datasets import (
    InvalidDataset,
    check_dataset_against_signature,
    dataset_samples,
    inspect_npz,
    iter_batches,
)

DIGITS_SIGNATURE = {
    "inputs": [{"name": "input", "dtype": "float32", "shape": ["batch", 1, 8, 8]}],
    "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 10]}],
}


def test_inspect_validation_set(digits, digits_validation):
    info = inspect_npz(digits_validation)
    samples = len(digits.x_val)
    assert info == {
        "samples": samples,
        "arrays": {
            "input": {"dtype": "float32", "shape": [samples, 1, 8, 8]},
            "labels": {"dtype": "int64", "shape": [samples]},
        },
        "has_labels": True,
    }
    assert dataset_samples(digits_validation) == samples


def test_compressed_npz_is_read_too(digits, tmp_path):
    path = tmp_path / "c.npz"
    with open(path, "wb") as handle:
        np.savez_compressed(handle, input=digits.x_calib)
    assert inspect_npz(path)["samples"] == len(digits.x_calib)
    batches = list(iter_batches(path, input_names=["input"], batch_size=50))
    np.testing.assert_array_equal(np.concatenate([b["input"] for b in batches]), digits.x_calib)


def test_not_an_npz(tmp_path):
    path = tmp_path / "x.npz"
    path.write_bytes(b"not numpy at all" * 10)
    with pytest.raises(InvalidDataset, match="not an .npz"):
        inspect_npz(path)


def test_single_npy_is_not_an_npz(tmp_path):
    path = tmp_path / "x.npz"
    with open(path, "wb") as handle:
        np.save(handle, np.zeros(3))
    with pytest.raises(InvalidDataset, match="single array"):
        inspect_npz(path)


def test_empty_npz(tmp_path):
    with pytest.raises(InvalidDataset, match="no arrays"):
        inspect_npz(write_npz(tmp_path / "e.npz"))


def test_object_arrays_are_rejected_without_unpickling(tmp_path):
    path = tmp_path / "o.npz"
    with open(path, "wb") as handle:
        np.savez(handle, input=np.array([{"a": 1}, None], dtype=object))
    with pytest.raises(InvalidDataset, match="'input' holds Python objects"):
        inspect_npz(path)


def test_differing_sample_counts(tmp_path):
    path = write_npz(tmp_path / "d.npz", input=np.zeros((5, 2), np.float32), labels=np.zeros(4, np.int64))
    with pytest.raises(InvalidDataset, match="input: 5, labels: 4"):
        inspect_npz(path)


def test_zero_samples(tmp_path):
    with pytest.raises(InvalidDataset, match="zero samples"):
        inspect_npz(write_npz(tmp_path / "z.npz", input=np.zeros((0, 1, 8, 8), np.float32)))


def test_scalar_array(tmp_path):
    with pytest.raises(InvalidDataset, match="scalar"):
        inspect_npz(write_npz(tmp_path / "s.npz", input=np.float32(1.0)))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_name_the_array_and_sample(tmp_path, bad):
    pixels = np.zeros((10, 1, 8, 8), np.float32)
    pixels[7, 0, 3, 3] = bad
    path = write_npz(tmp_path / "n.npz", input=pixels, labels=np.arange(10))
    with pytest.raises(InvalidDataset, match=r"'input' contains NaN or Inf \(first at sample 7\)"):
        inspect_npz(path)


def test_nan_scan_works_across_blocks(tmp_path, monkeypatch):
    from workers import datasets

    monkeypatch.setattr(datasets, "_SCAN_BLOCK_BYTES", 64)
    values = np.zeros((100, 4), np.float64)
    values[93, 2] = np.nan
    with pytest.raises(InvalidDataset, match="first at sample 93"):
        inspect_npz(write_npz(tmp_path / "n.npz", x=values))


def test_signature_fits(digits_validation):
    assert check_dataset_against_signature(inspect_npz(digits_validation), DIGITS_SIGNATURE) == []


def test_signature_problems_are_listed_in_words():
    info = {
        "samples": 4,
        "arrays": {
            "input": {"dtype": "float64", "shape": [4, 1, 8]},
            "extra": {"dtype": "float32", "shape": [4]},
            "labels": {"dtype": "int64", "shape": [4]},
        },
    }
    signature = {"inputs": DIGITS_SIGNATURE["inputs"] + [{"name": "mask", "dtype": "int64", "shape": ["batch", 8]}]}
    problems = check_dataset_against_signature(info, signature)
    assert any("float64" in p and "float32" in p and "'input'" in p for p in problems)
    assert any("rank 3" in p and "rank 4" in p for p in problems)
    assert any("missing array for model input 'mask'" in p for p in problems)
    assert any("'extra' matches no model input" in p for p in problems)
    assert not any("labels" in p for p in problems)
    assert len(problems) == 4


def test_static_dims_must_match_and_symbolic_dims_accept_anything():
    signature = {"inputs": [{"name": "x", "dtype": "float32", "shape": [1, "seq", 16]}]}
    fits = {"arrays": {"x": {"dtype": "float32", "shape": [100, 37, 16]}}}
    assert check_dataset_against_signature(fits, signature) == []
    wrong = {"arrays": {"x": {"dtype": "float32", "shape": [100, 37, 15]}}}
    (problem,) = check_dataset_against_signature(wrong, signature)
    assert "axis 2" in problem and "15" in problem and "16" in problem


def test_iter_batches_returns_all_samples_in_order(digits, digits_validation):
    batches = list(iter_batches(digits_validation, input_names=["input"], batch_size=32))
    sizes = [len(b["input"]) for b in batches]
    assert all(size == 32 for size in sizes[:-1]) and sum(sizes) == len(digits.x_val)
    assert all(set(b) == {"input"} for b in batches)
    np.testing.assert_array_equal(np.concatenate([b["input"] for b in batches]), digits.x_val)


def test_iter_batches_with_several_inputs_and_a_limit(tmp_path):
    a = np.arange(50, dtype=np.int64).reshape(25, 2)
    b = np.arange(25, dtype=np.float32)
    path = write_npz(tmp_path / "m.npz", a=a, b=b)
    batches = list(iter_batches(path, input_names=["a", "b"], batch_size=4, limit=10))
    assert [len(x["a"]) for x in batches] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate([x["a"] for x in batches]), a[:10])
    np.testing.assert_array_equal(np.concatenate([x["b"] for x in batches]), b[:10])


def test_iter_batches_never_loads_a_whole_array(digits, digits_validation, monkeypatch):
    def whole_array_load(self, key):
        raise AssertionError("iter_batches loaded a whole array")

    monkeypatch.setattr(np.lib.npyio.NpzFile, "__getitem__", whole_array_load)
    batches = list(iter_batches(digits_validation, input_names=["input"], batch_size=64))
    np.testing.assert_array_equal(np.concatenate([b["input"] for b in batches]), digits.x_val)


def test_iter_batches_handles_fortran_order(tmp_path):
    values = np.asfortranarray(np.arange(60, dtype=np.float32).reshape(10, 6))
    path = write_npz(tmp_path / "f.npz", x=values)
    batches = list(iter_batches(path, input_names=["x"], batch_size=3))
    np.testing.assert_array_equal(np.concatenate([b["x"] for b in batches]), values)


def test_iter_batches_missing_input(digits_validation):
    with pytest.raises(InvalidDataset, match="'mask'"):
        list(iter_batches(digits_validation, input_names=["input", "mask"], batch_size=8))


def test_big_endian_arrays_come_out_native(tmp_path):
    values = np.arange(12, dtype=">f4").reshape(6, 2)
    path = write_npz(tmp_path / "be.npz", x=values)
    assert inspect_npz(path)["arrays"]["x"]["dtype"] == "float32"
    (batch,) = iter_batches(path, input_names=["x"], batch_size=6)
    assert batch["x"].dtype == np.dtype("=f4")
    np.testing.assert_array_equal(batch["x"], values)
