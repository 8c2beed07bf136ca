"""Registry: uploads are validated, hashed, stored once; bad input is a 4xx that leaves nothing behind."""
from __future__ import annotations

import zipfile

import onnx
import pytest

from kiln.registry import storage
from kiln.registry.models import Blob, Dataset, Model
from tests.conftest import upload
from tests.fixtures.models import build_transformer_like, make_model_zip, write_npz

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def private_blob_root(settings, tmp_path):
    settings.BLOB_ROOT = tmp_path / "blobs"
    settings.UPLOAD_TMP_DIR = tmp_path / "uploads"


def blob_files(settings) -> list:
    return [p for p in settings.BLOB_ROOT.rglob("*") if p.is_file()] if settings.BLOB_ROOT.exists() else []


def test_upload_onnx_creates_model_and_version_with_signature(tenant, model_files):
    response = upload(tenant.client, "/api/v1/models/", model_files["model"], name="digits")
    assert response.status_code == 201, response.content
    body = response.json()
    version = body["versions"][0]
    assert body["name"] == "digits" and version["number"] == 1
    assert version["signature"]["inputs"] == [{"name": "input", "dtype": "float32", "shape": ["batch", 1, 8, 8]}]
    assert version["signature"]["outputs"][0]["shape"] == ["batch", 10]
    assert version["op_histogram"]["Conv"] == 2
    assert version["parameter_count"] > 1000
    assert version["validation"]["ok"] is True
    assert version["opset"] == 17
    downloaded = tenant.client.get(version["download_url"])
    assert b"".join(downloaded.streaming_content) == model_files["model"].read_bytes()


def test_identical_bytes_are_stored_once(tenant, model_files, settings):
    upload(tenant.client, "/api/v1/models/", model_files["model"], name="a")
    second = upload(tenant.client, "/api/v1/models/", model_files["model"], name="b")
    assert second.status_code == 201
    assert Blob.objects.count() == 1
    assert len(blob_files(settings)) == 1


def test_a_byte_identical_upload_names_the_model_it_duplicates_within_the_organization(tenant, other_tenant, model_files):
    first = upload(tenant.client, "/api/v1/models/", model_files["model"], name="original").json()
    assert first["identical_to"] == []
    # Another organization's copy of the same bytes is not named (tenant isolation).
    assert upload(other_tenant.client, "/api/v1/models/", model_files["model"], name="theirs").json()["identical_to"] == []
    again = upload(tenant.client, "/api/v1/models/", model_files["model"], name="copy").json()
    assert again["identical_to"] == [{"model": first["id"], "name": "original", "version": 1, "version_id": first["versions"][0]["id"]}]
    version = upload(tenant.client, f"/api/v1/models/{again['id']}/versions/", model_files["model"]).json()
    assert [row["name"] for row in version["identical_to"]] == ["original", "copy"]


def test_new_version_gets_the_next_number(tenant, model_files, tmp_path):
    model_id = upload(tenant.client, "/api/v1/models/", model_files["model"], name="m").json()["id"]
    other = tmp_path / "transformer.onnx"
    onnx.save(build_transformer_like(), other)
    response = upload(tenant.client, f"/api/v1/models/{model_id}/versions/", other)
    assert response.status_code == 201, response.content
    assert response.json()["number"] == 2
    assert "LayerNormalization" in response.json()["op_histogram"]


def test_zip_with_external_data_is_accepted(tenant, tmp_path):
    archive = make_model_zip(build_transformer_like(hidden=64), tmp_path / "big.zip")
    response = upload(tenant.client, "/api/v1/models/", archive, name="zipped")
    assert response.status_code == 201, response.content
    assert response.json()["versions"][0]["source_format"] == "onnx-zip"


@pytest.mark.parametrize(
    "content, filename, code",
    [
        (b"this is not a model", "model.onnx", "invalid_model"),
        (b"", "empty.onnx", "invalid"),
        (b"\x08\x07", "model.txt", "unsupported_format"),
    ],
)
def test_bad_model_uploads_are_400_and_leave_nothing(tenant, settings, tmp_path, content, filename, code):
    path = tmp_path / filename
    path.write_bytes(content)
    response = upload(tenant.client, "/api/v1/models/", path)
    assert response.status_code == 400
    assert response.json()["code"] == code
    assert response.json()["error"]
    assert Model.objects.count() == 0 and Blob.objects.count() == 0
    assert blob_files(settings) == []


def _pytorch_checkpoint(path):
    import torch

    torch.save({"weight": torch.zeros(2, 2)}, path)
    return path.read_bytes()


@pytest.mark.parametrize("content, says", [
    (_pytorch_checkpoint, "it is a zip archive (a PyTorch .pt/.pth checkpoint saved with torch.save is one)"),
    (b"\x80\x04\x95" + b"\x00" * 40, "it is a Python pickle"),
    (b"\x89HDF\r\n\x1a\n" + b"\x00" * 40, "it is an HDF5 file (a Keras .h5 model)"),
    (b"<!DOCTYPE html><html><body>Sign in</body></html>", "it is an HTML or XML page"),
    (b"\x12\xff\xfe\x00\x01garbage\x00\x9a", "its bytes do not read as one"),
])
def test_a_file_that_is_not_onnx_is_named_for_what_it_is_with_how_to_export(tenant, tmp_path, content, says):
    path = tmp_path / "model.onnx"
    path.write_bytes(content(tmp_path / "checkpoint.pt") if callable(content) else content)
    response = upload(tenant.client, "/api/v1/models/", path)
    assert response.status_code == 400 and response.json()["code"] == "invalid_model"
    message = response.json()["error"]
    assert message.startswith("model.onnx is not an ONNX model: ") and says in message
    assert "torch.onnx.export" in message and "tf2onnx" in message
    # Neither the server's paths nor the protobuf parser's own words.
    assert "/tmp" not in message and "proto" not in message.lower() and str(tmp_path) not in message


def test_truncated_onnx_is_rejected(tenant, model_files, tmp_path, settings):
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(model_files["model"].read_bytes()[:-4000])
    response = upload(tenant.client, "/api/v1/models/", truncated)
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_model"
    assert Model.objects.count() == 0 and blob_files(settings) == []


def _zip(path, entries: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)


@pytest.mark.parametrize("member", ["../escape.onnx", "/abs/model.onnx"])
def test_zip_slip_is_refused(tenant, model_files, tmp_path, settings, member):
    archive = tmp_path / "evil.zip"
    _zip(archive, {member: model_files["model"].read_bytes()})
    response = upload(tenant.client, "/api/v1/models/", archive)
    assert response.status_code == 400
    assert response.json()["code"] == "unsafe_archive"
    assert not (tmp_path / "escape.onnx").exists()
    assert Model.objects.count() == 0 and blob_files(settings) == []


def test_zip_bomb_is_refused(tenant, tmp_path, settings):
    settings.MAX_ARCHIVE_RATIO = 50
    archive = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as handle:
        handle.writestr("model.onnx", b"\0" * (20 * 1024 * 1024))
    response = upload(tenant.client, "/api/v1/models/", archive)
    assert response.status_code == 400
    assert response.json()["code"] == "unsafe_archive"


def test_upload_over_the_limit_is_413_before_reading(tenant, model_files, settings):
    settings.MAX_UPLOAD_BYTES = 1024
    response = upload(tenant.client, "/api/v1/models/", model_files["model"])
    assert response.status_code == 413
    assert response.json()["code"] == "upload_too_large"
    assert Model.objects.count() == 0


def test_streamed_upload_over_the_limit_stops_in_the_handler(tenant, settings):
    """A body without a trustworthy Content-Length is cut off by the streaming handler."""
    from django.test import RequestFactory

    from kiln.core.errors import UploadTooLarge
    from kiln.registry.uploads import HashingUploadHandler

    settings.MAX_UPLOAD_BYTES = 10
    handler = HashingUploadHandler(RequestFactory().post("/"))
    handler.new_file("file", "x.onnx", "application/octet-stream", 0)
    with pytest.raises(UploadTooLarge):
        handler.receive_data_chunk(b"x" * 11, 0)


def test_dataset_upload_reports_samples_and_arrays(tenant, model_files):
    response = upload(tenant.client, "/api/v1/datasets/", model_files["validation"], name="val", kind="validation")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["samples"] == 360 and body["has_labels"] is True
    assert body["arrays"]["input"]["shape"] == [360, 1, 8, 8]


def test_dataset_with_pickled_objects_is_refused(tenant, tmp_path):
    import numpy as np

    path = tmp_path / "evil.npz"
    np.savez(path, input=np.array([object(), object()], dtype=object))
    response = upload(tenant.client, "/api/v1/datasets/", path, kind="calibration")
    assert response.status_code == 400
    assert Dataset.objects.count() == 0


def test_dataset_with_nan_is_refused(tenant, tmp_path):
    import numpy as np

    path = write_npz(tmp_path / "nan.npz", input=np.full((4, 1, 8, 8), np.nan, dtype=np.float32))
    response = upload(tenant.client, "/api/v1/datasets/", path, kind="calibration")
    assert response.status_code == 400
    assert "input" in response.json()["error"]


def test_dataset_must_be_npz(tenant, tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("1,2,3")
    response = upload(tenant.client, "/api/v1/datasets/", path, kind="calibration")
    assert response.status_code == 400
    assert response.json()["code"] == "unsupported_format"


def test_blob_paths_refuse_non_digests():
    with pytest.raises(ValueError):
        storage.blob_key("../../etc/passwd")


def test_browser_session_upload_works_with_csrf(model_files, db):
    """A session's CSRF check parses the body before the view: uploads must still stream and hash."""
    from rest_framework.test import APIClient

    from tests.conftest import make_tenant

    make_tenant(username="sam", organization="Sams", password="a-long-password-1")
    client = APIClient(enforce_csrf_checks=True)
    client.get("/api/v1/auth/csrf/")
    client.post("/api/v1/auth/login/", {"username": "sam", "password": "a-long-password-1"}, format="json", HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value)
    with open(model_files["model"], "rb") as handle:
        response = client.post("/api/v1/models/", {"name": "web", "file": handle}, format="multipart", HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value)
    assert response.status_code == 201, response.content
    assert len(response.json()["versions"][0]["sha256"]) == 64


def test_invalid_model_message_names_the_users_file(tenant, tmp_path):
    path = tmp_path / "my-model.onnx"
    path.write_bytes(b"\x0a\x05hello-not-onnx")
    response = upload(tenant.client, "/api/v1/models/", path)
    assert response.status_code == 400
    assert "tmp" not in response.json()["error"].lower() or "my-model.onnx" in response.json()["error"]


def test_a_damaged_stored_copy_is_replaced_by_the_next_upload_of_those_bytes(settings, tmp_path):
    settings.BLOB_ROOT = tmp_path / "blobs"
    source = tmp_path / "model.bin"
    source.write_bytes(b"weights" * 1000)
    sha, _ = storage.file_sha256(source)
    storage.put_file(source, sha256=sha)
    stored = storage.local_path(sha)
    stored.write_bytes(b"bit rot" + stored.read_bytes()[7:])
    storage.put_file(source, sha256=sha)
    assert storage.file_sha256(stored)[0] == sha


def test_output_kinds_are_inferred_at_upload_and_can_be_overridden(tenant, other_tenant, model_files):
    body = upload(tenant.client, "/api/v1/models/", model_files["model"], name="digits").json()
    version = body["versions"][0]
    assert version["output_kinds"]["logits"]["kind"] == "class_scores"
    assert "Gemm" in version["output_kinds"]["logits"]["reason"] and not version["output_kinds"]["logits"]["overridden"]
    url = f"/api/v1/models/{body['id']}/versions/1/"
    changed = tenant.client.patch(url, {"output_kinds": {"logits": "embedding"}}, format="json")
    assert changed.status_code == 200, changed.content
    kinds = changed.json()["output_kinds"]["logits"]
    assert kinds == {"kind": "embedding", "inferred": "class_scores", "reason": kinds["reason"], "overridden": True}
    assert tenant.client.get(url).json()["output_kinds"]["logits"]["kind"] == "embedding"
    restored = tenant.client.patch(url, {"output_kinds": {"logits": None}}, format="json").json()
    assert restored["output_kinds"]["logits"]["kind"] == "class_scores"
    assert other_tenant.client.patch(url, {"output_kinds": {"logits": "embedding"}}, format="json").status_code == 404


@pytest.mark.parametrize("overrides, code", [
    ({"nope": "embedding"}, "unknown_output"),
    ({"logits": "sentiment"}, "invalid_output_kinds"),
])
def test_bad_output_kind_overrides_are_400(tenant, model_files, overrides, code):
    body = upload(tenant.client, "/api/v1/models/", model_files["model"], name="digits").json()
    response = tenant.client.patch(f"/api/v1/models/{body['id']}/versions/1/", {"output_kinds": overrides}, format="json")
    assert response.status_code == 400 and response.json()["code"] == code
