"""Blobs in S3-compatible storage (a real moto server process): stored under their digest, read back
through short-lived presigned URLs, verified when agents upload straight to storage, released on delete."""
from __future__ import annotations

import hashlib
import shutil
from urllib.parse import parse_qs, urlsplit

import onnx
import pytest
import requests

from kiln.core.errors import KilnError
from kiln.registry import storage
from kiln.registry.models import Blob, ModelVersion
from kiln.registry.selectors import model_version_onnx_path
from kiln.registry.services import blob_create_staged
from tests.conftest import upload
from tests.fixtures.models import build_transformer_like, make_model_zip
from tests.fixtures.s3 import BUCKET

pytestmark = pytest.mark.timeout(120)


def _key(sha256: str) -> str:
    return f"{sha256[:2]}/{sha256}"


def test_an_upload_lands_in_s3_and_its_download_is_a_short_lived_presigned_url(tenant, other_tenant, s3_storage, model_files, settings):
    body = upload(tenant.client, "/api/v1/models/", model_files["model"], name="digits").json()
    sha256 = body["versions"][0]["sha256"]
    assert s3_storage.object_keys() == [_key(sha256)]
    assert s3_storage.read(_key(sha256)) == model_files["model"].read_bytes()
    assert not (settings.BLOB_ROOT / sha256[:2] / sha256).exists(), "with S3 the folder holds no stored copy"

    download = tenant.client.get(f"/api/v1/models/{body['id']}/versions/1/download/")
    assert download.status_code == 302
    location = urlsplit(download["Location"])
    query = parse_qs(location.query)
    assert f"{location.scheme}://{location.netloc}" == s3_storage.endpoint
    assert location.path == f"/{BUCKET}/{_key(sha256)}", "the URL names exactly one object"
    assert query["X-Amz-Expires"] == ["60"] and query["X-Amz-Signature"]
    assert "digits.onnx" in query["response-content-disposition"][0]
    fetched = requests.get(download["Location"], timeout=30)
    assert fetched.status_code == 200 and fetched.content == model_files["model"].read_bytes()

    stranger = other_tenant.client.get(f"/api/v1/models/{body['id']}/versions/1/download/")
    assert stranger.status_code == 404 and "Location" not in stranger


def test_a_damaged_copy_in_s3_is_replaced_by_the_next_upload_of_those_bytes(s3_storage, tmp_path):
    source = tmp_path / "weights.bin"
    source.write_bytes(b"weights" * 5000)
    sha256 = hashlib.sha256(source.read_bytes()).hexdigest()
    storage.put_file(source, sha256=sha256)
    s3_storage.client().put_object(Bucket=BUCKET, Key=_key(sha256), Body=b"bit rot")
    storage.put_file(source, sha256=sha256)
    assert s3_storage.read(_key(sha256)) == source.read_bytes()


def test_shared_bytes_stay_in_s3_until_every_upload_of_them_is_deleted(transactional_db, tenant, other_tenant, s3_storage, model_files):
    first = upload(tenant.client, "/api/v1/models/", model_files["model"], name="one").json()
    second = upload(tenant.client, "/api/v1/models/", model_files["model"], name="two").json()
    theirs = upload(other_tenant.client, "/api/v1/models/", model_files["model"], name="theirs").json()
    key = _key(first["versions"][0]["sha256"])
    assert Blob.objects.count() == 2 and s3_storage.object_keys() == [key]

    assert tenant.client.delete(f"/api/v1/models/{first['id']}/").status_code == 204
    assert s3_storage.object_keys() == [key] and Blob.objects.filter(organization=tenant.organization).count() == 1
    assert tenant.client.delete(f"/api/v1/models/{second['id']}/").status_code == 204
    assert s3_storage.object_keys() == [key], "another organization still stores these bytes"
    assert Blob.objects.filter(organization=tenant.organization).count() == 0
    assert other_tenant.client.delete(f"/api/v1/models/{theirs['id']}/").status_code == 204
    assert s3_storage.object_keys() == [] and Blob.objects.count() == 0


def test_a_zipped_model_is_extracted_again_from_s3_on_a_host_without_a_local_copy(tenant, s3_storage, tmp_path, settings):
    archive = make_model_zip(build_transformer_like(hidden=32), tmp_path / "zipped.zip")
    body = upload(tenant.client, "/api/v1/models/", archive, name="zipped").json()
    shutil.rmtree(settings.BLOB_ROOT)  # a worker on another host starts with nothing
    version = ModelVersion.objects.get(pk=body["versions"][0]["id"])
    path = model_version_onnx_path(version)
    assert path.is_relative_to(settings.BLOB_ROOT) and onnx.load(str(path)).graph.node


def _stage(s3_server, data: bytes, *, announced: bytes | None = None) -> tuple[str, str, int]:
    announced = data if announced is None else announced
    sha256 = hashlib.sha256(announced).hexdigest()
    key = storage.incoming_key("test")
    plan = storage.presigned_upload(key, sha256=sha256, size_bytes=len(announced))
    assert plan["method"] == "PUT" and parse_qs(urlsplit(plan["url"]).query)["X-Amz-Expires"] == ["60"]
    assert urlsplit(plan["url"]).path == f"/{BUCKET}/{key}"
    response = requests.put(plan["url"], data=data, headers=plan["headers"], timeout=30)
    assert response.status_code == 200, response.text
    return key, sha256, len(announced)


def test_an_object_uploaded_through_a_presigned_url_becomes_a_blob_once_its_digest_checks_out(tenant, s3_storage):
    key, sha256, size = _stage(s3_storage, b"engine bytes" * 1000)
    blob = blob_create_staged(organization=tenant.organization, key=key, sha256=sha256, size_bytes=size)
    assert blob.sha256 == sha256 and s3_storage.object_keys() == [_key(sha256)], "staged object copied under its digest, then removed"
    assert hashlib.sha256(s3_storage.read(_key(sha256))).hexdigest() == sha256


@pytest.mark.parametrize("case", ["other bytes", "over the limit"])
def test_a_staged_upload_that_does_not_check_out_leaves_nothing(tenant, s3_storage, settings, case):
    if case == "other bytes":
        key, sha256, size = _stage(s3_storage, b"planted bytes" * 100, announced=b"genuine bytes" * 100)
    else:
        settings.MAX_UPLOAD_BYTES = 100
        key, sha256, size = _stage(s3_storage, b"x" * 1000)
    with pytest.raises(KilnError) as refused:
        blob_create_staged(organization=tenant.organization, key=key, sha256=sha256, size_bytes=size)
    assert refused.value.error_code == "staged_upload_rejected"
    assert s3_storage.object_keys() == [] and Blob.objects.count() == 0
