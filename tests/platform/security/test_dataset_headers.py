"""Forged `.npy` headers inside dataset uploads are refused before any data is read or allocated."""
from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from kiln.registry.models import Blob, Dataset
from tests.conftest import upload
from tests.platform.security.conftest import assert_json_error

pytestmark = pytest.mark.django_db


def forged_npz(path, *, shape, descr="<f4", data: bytes = b"", name: str = "input"):
    """An .npz whose member declares `shape` and `descr` but holds `data`."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": descr, "fortran_order": False, "shape": shape})
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}.npy", header.getvalue() + data)
    return path


def assert_refused(tenant, path, *words):
    blobs_before = Blob.objects.count()
    response = upload(tenant.client, "/api/v1/datasets/", path, kind="calibration")
    body = assert_json_error(response, 400, "invalid_dataset")
    for word in words:
        assert word in body["error"], body["error"]
    assert Dataset.objects.count() == 0
    assert Blob.objects.count() == blobs_before
    return body


@pytest.mark.parametrize(
    ("shape", "data", "words"),
    [
        ((4, -4), b"", ["impossible shape"]),
        ((-1, 4), b"\0" * 16, ["impossible shape"]),
        ((1, 10**12), b"\0" * 64, ["4000000000000 bytes", "holds 64 bytes"]),
        ((4, 4), b"\0" * 8, ["64 bytes", "holds 8 bytes"]),
        ((2, 2), b"\0" * 1000, ["16 bytes", "holds 1000 bytes"]),
    ],
)
def test_headers_that_lie_about_their_data(tenant, tmp_path, shape, data, words):
    assert_refused(tenant, forged_npz(tmp_path / "forged.npz", shape=shape, data=data), *words)


@pytest.mark.parametrize("descr", ["<U4", "<M8[s]", "<c8", "|V8", "<m8[s]"])
def test_dtypes_outside_the_numeric_allow_list(tenant, tmp_path, descr):
    itemsize = np.dtype(descr).itemsize
    path = forged_npz(tmp_path / "dtype.npz", shape=(2, 1), descr=descr, data=b"\0" * 2 * itemsize)
    assert_refused(tenant, path, "dtype")


def test_total_size_over_the_limit(tenant, tmp_path, settings):
    settings.MAX_DATASET_BYTES = 1024
    path = tmp_path / "big.npz"
    np.savez(path, input=np.zeros((64, 1, 8, 8), np.float32))
    assert_refused(tenant, path, "KILN_MAX_DATASET_BYTES")


def test_big_endian_and_integer_arrays_are_still_accepted(tenant, tmp_path):
    path = tmp_path / "ok.npz"
    np.savez(path, input=np.zeros((3, 1, 8, 8), ">f4"), labels=np.arange(3, dtype=np.int64))
    response = upload(tenant.client, "/api/v1/datasets/", path, kind="validation")
    assert response.status_code == 201, response.content
    assert response.json()["samples"] == 3


def test_negative_samples_never_reach_a_job(tenant, tmp_path, model_version):
    assert_refused(tenant, forged_npz(tmp_path / "neg.npz", shape=(-1, 1, 8, 8)), "impossible shape")
    assert not Dataset.objects.filter(samples__lt=1).exists()
