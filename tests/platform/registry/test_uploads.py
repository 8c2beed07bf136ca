"""Resumable uploads (tus): chunks at offsets, a broken chunk keeps what arrived, the whole digest is checked."""
from __future__ import annotations

import base64
import hashlib

import pytest

from kiln.registry import uploads
from kiln.registry.models import Blob, Model, Upload

pytestmark = pytest.mark.django_db

TUS = {"HTTP_TUS_RESUMABLE": "1.0.0"}


@pytest.fixture(autouse=True)
def private_storage(settings, tmp_path):
    settings.BLOB_ROOT = tmp_path / "blobs"
    settings.UPLOAD_TMP_DIR = tmp_path / "uploads"


def metadata(**pairs) -> str:
    return ",".join(f"{key} {base64.b64encode(value.encode()).decode()}" for key, value in pairs.items())


def create(client, data: bytes, *, filename: str = "model.onnx", sha256: str | None = None, base: str = "/api/v1/uploads/"):
    meta = metadata(filename=filename, sha256=sha256 if sha256 is not None else hashlib.sha256(data).hexdigest())
    return client.post(base, HTTP_UPLOAD_LENGTH=str(len(data)), HTTP_UPLOAD_METADATA=meta, **TUS)


def patch(client, url: str, chunk: bytes, offset: int, **extra):
    return client.generic("PATCH", url, chunk, content_type="application/offset+octet-stream", HTTP_UPLOAD_OFFSET=str(offset), **TUS, **extra)


def test_chunks_assemble_into_a_blob_that_becomes_a_model(tenant, model_files):
    data = model_files["model"].read_bytes()
    created = create(tenant.client, data, filename="digits.onnx")
    assert created.status_code == 201, created.content
    url = created["Location"]
    assert created["Tus-Resumable"] == "1.0.0"
    half = len(data) // 2
    first = patch(tenant.client, url, data[:half], 0)
    assert first.status_code == 204 and first["Upload-Offset"] == str(half)
    assert tenant.client.head(url, **TUS)["Upload-Offset"] == str(half)
    assert patch(tenant.client, url, data[half:], half)["Upload-Offset"] == str(len(data))
    status = tenant.client.get(url).json()
    assert status["complete"] is True and status["sha256"] == hashlib.sha256(data).hexdigest()
    model = tenant.client.post("/api/v1/models/", {"name": "digits", "upload": status["id"]}, format="json")
    assert model.status_code == 201, model.content
    assert model.json()["versions"][0]["sha256"] == status["sha256"]
    assert model.json()["versions"][0]["filename"] == "digits.onnx"
    # An upload is used once.
    again = tenant.client.post("/api/v1/models/", {"name": "digits", "upload": status["id"]}, format="json")
    assert again.status_code == 404


def test_a_dataset_comes_from_an_upload_too(tenant, model_files):
    data = model_files["validation"].read_bytes()
    url = create(tenant.client, data, filename="val.npz")["Location"]
    patch(tenant.client, url, data, 0)
    upload_id = tenant.client.get(url).json()["id"]
    dataset = tenant.client.post("/api/v1/datasets/", {"kind": "validation", "upload": upload_id}, format="json")
    assert dataset.status_code == 201, dataset.content
    assert dataset.json()["has_labels"] is True


def test_a_broken_chunk_keeps_the_bytes_that_arrived_and_resumes(tenant):
    data = bytes(range(256)) * (6 * 1024)  # 1.5 MiB: the first 1 MiB read succeeds, then the client "drops"
    url = create(tenant.client, data, filename="blob.bin")["Location"]
    # Declare more than is sent: the server's read runs dry mid-chunk like a dropped connection.
    broken = patch(tenant.client, url, data, 0, CONTENT_LENGTH=str(len(data) + 1024 * 1024))
    assert broken.status_code == 400 and broken.json()["code"] in ("chunk_interrupted", "upload_too_long")
    upload_row = Upload.objects.get()
    offset = int(tenant.client.head(url, **TUS)["Upload-Offset"])
    assert offset == upload_row.offset
    # Sending from a wrong offset is refused with the server's offset.
    wrong = patch(tenant.client, url, data[offset + 1:], offset + 1)
    assert wrong.status_code == 409 and wrong.json()["details"]["offset"] == offset
    assert patch(tenant.client, url, data[offset:], offset).status_code == 204
    assert tenant.client.get(url).json()["sha256"] == hashlib.sha256(data).hexdigest()


def test_a_chunk_at_a_web_host_without_the_earlier_bytes_is_refused_not_filled_with_zeros(tenant):
    data = bytes(range(256)) * 64
    url = create(tenant.client, data, filename="blob.bin")["Location"]
    assert patch(tenant.client, url, data[:4096], 0).status_code == 204
    part = uploads.part_path(Upload.objects.get().id)
    part.unlink()  # as on another host behind a load balancer: the first chunk's bytes are not here
    answer = patch(tenant.client, url, data[4096:], 4096)
    assert answer.status_code == 421 and answer.json()["code"] == "upload_on_another_server"
    assert "stickiness" in answer.json()["error"]
    assert not part.exists() and Upload.objects.get().offset == 4096


def test_interrupted_read_records_partial_offset(tenant):
    data = bytes(range(256)) * (6 * 1024)
    url = create(tenant.client, data + b"x" * 1024 * 1024, filename="blob.bin")["Location"]
    # The declared upload is longer, so the chunk is in range; the body stops after 1.5 MiB of 2.5 MiB.
    broken = patch(tenant.client, url, data, 0, CONTENT_LENGTH=str(len(data) + 1024 * 1024))
    assert broken.status_code == 400 and broken.json()["code"] == "chunk_interrupted"
    assert tenant.client.head(url, **TUS)["Upload-Offset"] == str(uploads.RESUMABLE_READ_BYTES)
    assert uploads.part_path(Upload.objects.get().id).stat().st_size == uploads.RESUMABLE_READ_BYTES


def test_wrong_digest_discards_the_upload(tenant):
    data = b"a" * 1000
    url = create(tenant.client, data, sha256="0" * 64)["Location"]
    answer = patch(tenant.client, url, data, 0)
    assert answer.status_code == 400 and answer.json()["code"] == "digest_mismatch"
    assert not Upload.objects.exists() and not Blob.objects.exists()


def test_limits_and_bad_headers_are_4xx(tenant, settings):
    settings.MAX_UPLOAD_BYTES = 1000
    too_big = tenant.client.post("/api/v1/uploads/", HTTP_UPLOAD_LENGTH="1001", **TUS)
    assert too_big.status_code == 413 and too_big.json()["code"] == "upload_too_large"
    assert tenant.client.post("/api/v1/uploads/", HTTP_UPLOAD_LENGTH="lots", **TUS).status_code == 400
    assert tenant.client.post("/api/v1/uploads/", HTTP_UPLOAD_LENGTH="10", HTTP_UPLOAD_METADATA="sha256 bm90aGV4", **TUS).status_code == 400
    url = create(tenant.client, b"0123456789")["Location"]
    assert patch(tenant.client, url, b"0123456789ab", 0).json()["code"] == "upload_too_long"
    wrong_type = tenant.client.generic("PATCH", url, b"0123", content_type="application/json", HTTP_UPLOAD_OFFSET="0")
    assert wrong_type.status_code == 415
    options = tenant.client.options("/api/v1/uploads/")
    assert options["Tus-Version"] == "1.0.0" and "creation" in options["Tus-Extension"]


def test_uploads_are_private_to_who_started_them(tenant, other_tenant):
    url = create(tenant.client, b"0123456789")["Location"]
    assert other_tenant.client.head(url, **TUS).status_code == 404
    assert patch(other_tenant.client, url, b"0123456789", 0).status_code == 404
    assert other_tenant.client.delete(url).status_code == 404
    upload_id = Upload.objects.get().id
    assert other_tenant.client.post("/api/v1/models/", {"upload": str(upload_id)}, format="json").status_code == 404
    assert tenant.client.delete(url).status_code == 204
    assert not Upload.objects.exists()


def test_incomplete_upload_cannot_become_a_model(tenant):
    url = create(tenant.client, b"0123456789", filename="m.onnx")["Location"]
    patch(tenant.client, url, b"01234", 0)
    upload_id = tenant.client.get(url).json()["id"]
    answer = tenant.client.post("/api/v1/models/", {"upload": upload_id}, format="json")
    assert answer.status_code == 409 and answer.json()["code"] == "upload_incomplete"
    assert not Model.objects.exists()


def test_file_and_upload_together_are_refused(tenant, model_files):
    with open(model_files["model"], "rb") as handle:
        answer = tenant.client.post("/api/v1/models/", {"file": handle, "upload": "6f1c1b9e-0000-4000-8000-000000000000"}, format="multipart")
    assert answer.status_code == 400


def test_a_refused_model_leaves_no_blob_behind(tenant):
    data = b"this is a text file, not an ONNX protobuf\n"
    url = create(tenant.client, data, filename="bad.onnx")["Location"]
    patch(tenant.client, url, data, 0)
    assert Blob.objects.count() == 1
    answer = tenant.client.post("/api/v1/models/", {"upload": tenant.client.get(url).json()["id"]}, format="json")
    assert answer.status_code == 400 and answer.json()["code"] == "invalid_model"
    assert not Blob.objects.exists() and not Upload.objects.exists()
