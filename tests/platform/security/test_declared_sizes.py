"""Small uploads whose headers declare huge contents are refused (400, nothing stored) from the
declared sizes, before the decoder allocates them: an `.npz` inside a dataset zip, a chunked HDF5
dataset, a PNG's dimensions; and a recipe nested deeper than any parser should recurse."""
from __future__ import annotations

import io
import struct
import zipfile
import zlib

import h5py
import numpy as np
import pytest
from PIL import Image

from kiln.registry import storage
from kiln.registry.models import Blob, Dataset
from tests.conftest import upload
from tests.platform.security.conftest import assert_json_error

pytestmark = pytest.mark.django_db

IMAGE_RECIPE = '{"type": "image", "input": "images", "size": [8, 8]}'


def assert_refused(tenant, path, *words, code="invalid_dataset", **fields):
    response = upload(tenant.client, "/api/v1/datasets/", path, kind="calibration", **fields)
    body = assert_json_error(response, 400, code)
    for word in words:
        assert word in body["error"], body["error"]
    assert "0x" not in body["error"] and "BytesIO" not in body["error"], body["error"]
    assert not Dataset.objects.exists()
    assert not Blob.objects.exists()
    assert not list(storage.settings.BLOB_ROOT.rglob("*.*")) if storage.settings.BLOB_ROOT.exists() else True
    return body


def npy_declaring(shape, descr="<f4", data=b"\0" * 64) -> bytes:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": descr, "fortran_order": False, "shape": shape})
    return header.getvalue() + data


def test_a_zip_of_samples_whose_npz_declares_a_terabyte_array(tenant, tmp_path):
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as sample:
        sample.writestr("input.npy", npy_declaring((10**12, 10**6)))
    path = tmp_path / "samples.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("sample-0.npz", inner.getvalue())
    assert path.stat().st_size < 2048
    assert_refused(tenant, path, "sample-0.npz", "declares shape [1000000000000, 1000000]", "holds 64 bytes")


def test_a_zip_of_compressed_samples_over_the_limit_in_declared_bytes(tenant, tmp_path, settings):
    """Each sample is a compressed .npz: the zip's own sizes are small, what its arrays declare is not."""
    settings.MAX_DATASET_BYTES = 100_000
    path = tmp_path / "samples.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for i in range(4):
            inner = io.BytesIO()
            np.savez_compressed(inner, input=np.zeros((1, 32, 32, 8), np.float32))  # 32 KB each, a few hundred bytes stored
            archive.writestr(f"sample-{i}.npz", inner.getvalue())
    assert sum(info.file_size for info in zipfile.ZipFile(path).infolist()) < 10_000
    assert_refused(tenant, path, "131,072 bytes by sample 'sample-3.npz'", "100,000 bytes (KILN_MAX_DATASET_BYTES)")


def test_a_tiny_hdf5_declaring_two_to_the_36_floats(tenant, tmp_path):
    path = tmp_path / "bomb.h5"
    with h5py.File(path, "w") as handle:
        # Chunked and never written: HDF5 stores no chunk, and reading it would fill 256 GB.
        handle.create_group("s0").create_dataset("input", shape=(2**36,), dtype="float32", chunks=(2**16,))
    assert path.stat().st_size < 10_000
    assert_refused(tenant, path, "262,144 MB", "KILN_MAX_DATASET_BYTES")


def test_an_hdf5_whose_dataset_needs_a_filter_hdf5_lacks(tenant, tmp_path):
    path = tmp_path / "filtered.h5"
    with h5py.File(path, "w") as handle:
        handle.create_group("s0").create_dataset("input", data=np.zeros((4, 4), np.float32), chunks=(2, 2), compression="gzip")
    raw = bytearray(path.read_bytes())
    # The deflate filter's id (1) in the pipeline message becomes 307, which no HDF5 build registers.
    at = raw.find(b"deflate")
    assert at > 0
    raw[at : at + 7] = b"unknown"
    message = raw.rfind(struct.pack("<H", 1), 0, at)
    raw[message : message + 2] = struct.pack("<H", 307)
    path.write_bytes(bytes(raw))
    assert_refused(tenant, path, "filtered.h5 could not be read as HDF5")


def png_declaring(width: int, height: int) -> bytes:
    small = io.BytesIO()
    Image.new("RGB", (1, 1)).save(small, format="PNG")
    data = bytearray(small.getvalue())
    ihdr = data.index(b"IHDR")
    data[ihdr + 4 : ihdr + 12] = struct.pack(">II", width, height)
    data[ihdr + 17 : ihdr + 21] = struct.pack(">I", zlib.crc32(bytes(data[ihdr : ihdr + 17])))
    return bytes(data)


@pytest.mark.parametrize(("width", "height"), [(100_000, 100_000), (16_000, 12_000)])
def test_a_png_declaring_too_many_pixels(tenant, tmp_path, width, height):
    path = tmp_path / "images.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("big.png", png_declaring(width, height))
    assert_refused(tenant, path, "big.png", "pixels", recipe=IMAGE_RECIPE)


def test_a_recipe_nested_five_thousand_levels(tenant, tmp_path):
    path = tmp_path / "images.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a.png", png_declaring(1, 1))
    nested = '{"type": "image", "size": [8, 8], "x": ' + "[" * 5000 + "]" * 5000 + "}"
    assert_refused(tenant, path, "nests more than", code="invalid_recipe", recipe=nested)
