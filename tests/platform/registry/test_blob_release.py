"""Deleting models, versions and datasets releases the stored files nothing references any more,
role-checked, scoped to the organization, and safe against an upload of the same bytes at that moment."""
from __future__ import annotations

import hashlib
import threading
import time

import onnx
import pytest
from django.db import connection, transaction

from kiln.registry import storage
from kiln.registry.models import Blob, Dataset
from kiln.registry.services import dataset_create, dataset_delete
from kiln.registry.uploads import StoredUpload
from tests.conftest import make_tenant, upload


@pytest.fixture(autouse=True)
def blob_root(settings, tmp_path):
    settings.BLOB_ROOT = tmp_path / "blobs"


def _stored(sha256: str) -> bool:
    return storage.local_path(sha256).exists()


def _second_model(model_files, tmp_path):
    """The digits model with other bytes (a doc string), as a second version."""
    model = onnx.load(str(model_files["model"]))
    model.doc_string = "version two"
    path = tmp_path / "digits-v2.onnx"
    onnx.save(model, str(path))
    return path


def test_deleting_a_version_releases_its_file_and_the_last_version_stays(transactional_db, tenant, model_files, tmp_path):
    body = upload(tenant.client, "/api/v1/models/", model_files["model"], name="digits").json()
    second = upload(tenant.client, f"/api/v1/models/{body['id']}/versions/", _second_model(model_files, tmp_path)).json()
    first_sha, second_sha = body["versions"][0]["sha256"], second["sha256"]
    assert _stored(first_sha) and _stored(second_sha)

    assert tenant.client.delete(f"/api/v1/models/{body['id']}/versions/1/").status_code == 204
    assert not _stored(first_sha) and _stored(second_sha)
    assert [v["number"] for v in tenant.client.get(f"/api/v1/models/{body['id']}/").json()["versions"]] == [2]
    last = tenant.client.delete(f"/api/v1/models/{body['id']}/versions/2/")
    assert last.status_code == 409 and last.json()["code"] == "last_version"
    assert _stored(second_sha)


def test_a_file_shared_by_two_uploads_stays_until_both_are_gone(transactional_db, tenant, model_files):
    first = upload(tenant.client, "/api/v1/datasets/", model_files["calibration"], name="a", kind="calibration").json()
    second = upload(tenant.client, "/api/v1/datasets/", model_files["calibration"], name="b", kind="calibration").json()
    sha256 = hashlib.sha256(model_files["calibration"].read_bytes()).hexdigest()
    assert Blob.objects.count() == 1

    assert tenant.client.delete(f"/api/v1/datasets/{first['id']}/").status_code == 204
    assert _stored(sha256) and Blob.objects.count() == 1
    assert tenant.client.delete(f"/api/v1/datasets/{second['id']}/").status_code == 204
    assert not _stored(sha256) and Blob.objects.count() == 0


def test_deletes_are_for_members_who_may_write_in_that_organization(tenant, other_tenant, model_files, tmp_path):
    viewer = make_tenant(username="vic", organization="Acme", role="viewer")
    model = upload(tenant.client, "/api/v1/models/", model_files["model"], name="digits").json()
    upload(tenant.client, f"/api/v1/models/{model['id']}/versions/", _second_model(model_files, tmp_path))
    dataset = upload(tenant.client, "/api/v1/datasets/", model_files["calibration"], name="a", kind="calibration").json()
    urls = [f"/api/v1/models/{model['id']}/versions/1/", f"/api/v1/models/{model['id']}/", f"/api/v1/datasets/{dataset['id']}/"]
    for url in urls:
        assert viewer.client.delete(url).status_code == 403, url
        assert other_tenant.client.delete(url).status_code == 404, url
    assert len(tenant.client.get(f"/api/v1/models/{model['id']}/").json()["versions"]) == 2
    assert Dataset.objects.count() == 1 and Blob.objects.count() == 3


def test_an_upload_of_the_same_bytes_during_a_release_keeps_its_file(transactional_db, tenant, model_files):
    if connection.vendor != "postgresql":
        pytest.skip("SQLite serializes every transaction already (IMMEDIATE); the digest lock is PostgreSQL's")
    path = model_files["calibration"]
    sha256 = hashlib.sha256(path.read_bytes()).hexdigest()

    def dataset_upload(name: str):
        stored = StoredUpload(name="calibration.npz", path=path, sha256=sha256)
        return dataset_create(organization=tenant.organization, user=tenant.user, name=name, kind="calibration", upload=stored)

    doomed = dataset_upload("doomed")
    outcome = {}

    def upload_meanwhile():
        try:
            outcome["dataset"] = dataset_upload("newcomer")
        except Exception as exc:  # reported below
            outcome["error"] = exc
        finally:
            connection.close()

    with transaction.atomic():
        dataset_delete(dataset=doomed)  # holds the digest's lock until the commit
        uploader = threading.Thread(target=upload_meanwhile)
        uploader.start()
        time.sleep(1.0)
        assert uploader.is_alive(), "the upload of the same bytes waits for the release to finish"
    uploader.join(timeout=30)
    assert "error" not in outcome, outcome.get("error")
    newcomer = Dataset.objects.select_related("blob").get(pk=outcome["dataset"].pk)
    assert newcomer.blob.sha256 == sha256 and storage.file_sha256(storage.local_path(sha256))[0] == sha256
