"""Error messages name the user's own file and its entries, never the server's folders."""
from __future__ import annotations

import zipfile

import numpy as np
import onnx
import pytest
from django.conf import settings as django_settings

from kiln.registry.models import Blob, Dataset, Model
from tests.conftest import upload
from tests.fixtures.models import save_with_external_data
from tests.platform.security.conftest import assert_json_error

pytestmark = pytest.mark.django_db


def assert_no_server_paths(message: str) -> None:
    for root in (django_settings.DATA_DIR, django_settings.UPLOAD_TMP_DIR, django_settings.BLOB_ROOT, "/tmp"):
        assert str(root) not in message, message
    assert ".upload" not in message and "extract-" not in message, message


def test_bad_npz_names_the_users_file_and_says_how_to_fix_it(tenant, tmp_path):
    path = tmp_path / "my-calibration.npz"
    path.write_bytes(b"PK\x03\x04 this is not a zip")
    body = assert_json_error(upload(tenant.client, "/api/v1/datasets/", path, kind="calibration"), 400)
    assert "my-calibration.npz" in body["error"]
    assert "allow_pickle" not in body["error"]
    assert "numpy.savez" in body["error"]
    assert_no_server_paths(body["error"])


def test_pickled_npz_does_not_suggest_allow_pickle(tenant, tmp_path):
    path = tmp_path / "objects.npz"
    np.savez(path, input=np.array([{"a": 1}], dtype=object))
    body = assert_json_error(upload(tenant.client, "/api/v1/datasets/", path, kind="calibration"), 400)
    assert "allow_pickle" not in body["error"]
    assert_no_server_paths(body["error"])
    assert Dataset.objects.count() == 0


def test_external_data_errors_name_archive_entries(tenant, tmp_path, digits):
    folder = tmp_path / "model"
    onnx_path = save_with_external_data(digits.model, folder)
    data_files = [p for p in folder.iterdir() if p != onnx_path]
    archive = tmp_path / "broken-weights.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        handle.write(onnx_path, "model.onnx")
        for data in data_files:
            handle.writestr(data.name, data.read_bytes()[:10])  # truncated weights
    body = assert_json_error(upload(tenant.client, "/api/v1/models/", archive), 400)
    assert_no_server_paths(body["error"])
    assert any(data.name in body["error"] for data in data_files) or "model.onnx" in body["error"], body["error"]
    assert Model.objects.count() == 0 and Blob.objects.count() == 0


def test_corrupt_onnx_error_names_the_users_file(tenant, tmp_path, digits):
    path = tmp_path / "resnet-final.onnx"
    path.write_bytes(digits.model.SerializeToString()[:200])
    body = assert_json_error(upload(tenant.client, "/api/v1/models/", path), 400, "invalid_model")
    assert "resnet-final.onnx" in body["error"]
    assert_no_server_paths(body["error"])


def test_external_data_pointing_outside_is_refused_without_paths(tenant, tmp_path, digits):
    model = onnx.ModelProto()
    model.CopyFrom(digits.model)
    tensor = model.graph.initializer[0]
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value="../../etc/passwd")
    archive = tmp_path / "escape.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        handle.writestr("model.onnx", model.SerializeToString())
    body = assert_json_error(upload(tenant.client, "/api/v1/models/", archive), 400)
    assert_no_server_paths(body["error"])
    assert Model.objects.count() == 0
