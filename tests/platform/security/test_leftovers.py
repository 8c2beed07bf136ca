"""What the probe found beside the main classes: blobs left behind by deletes, a dataset used in
the wrong role, and models whose declared input sizes would exhaust a worker."""
from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from kiln.pipeline.models import DeploymentJob
from kiln.registry import storage
from kiln.registry.models import Blob, Model
from tests.conftest import make_tenant, upload
from tests.platform.security.conftest import assert_json_error

pytestmark = pytest.mark.django_db


def test_deleting_a_model_releases_its_blobs_and_files(tenant, model_files, django_capture_on_commit_callbacks):
    model = upload(tenant.client, "/api/v1/models/", model_files["model"]).json()
    sha = model["versions"][0]["sha256"]
    assert storage.blob_exists(sha)
    with django_capture_on_commit_callbacks(execute=True):
        assert tenant.client.delete(f"/api/v1/models/{model['id']}/").status_code == 204
    assert not Blob.objects.filter(sha256=sha).exists()
    assert not storage.blob_exists(sha)


def test_deleting_a_dataset_releases_its_blob(tenant, model_files, django_capture_on_commit_callbacks):
    dataset = upload(tenant.client, "/api/v1/datasets/", model_files["calibration"], kind="calibration").json()
    blob = Blob.objects.get()
    with django_capture_on_commit_callbacks(execute=True):
        assert tenant.client.delete(f"/api/v1/datasets/{dataset['id']}/").status_code == 204
    assert not Blob.objects.exists()
    assert not storage.blob_exists(blob.sha256)


def test_shared_bytes_stay_while_anything_references_them(tenant, model_files, django_capture_on_commit_callbacks):
    other = make_tenant(username="bob", organization="Other")
    first = upload(tenant.client, "/api/v1/datasets/", model_files["calibration"], kind="calibration").json()
    second = upload(tenant.client, "/api/v1/datasets/", model_files["calibration"], kind="validation").json()
    theirs = upload(other.client, "/api/v1/datasets/", model_files["calibration"], kind="calibration").json()
    sha = Blob.objects.first().sha256
    with django_capture_on_commit_callbacks(execute=True):
        tenant.client.delete(f"/api/v1/datasets/{first['id']}/")
    assert Blob.objects.filter(organization=tenant.organization).count() == 1  # still used by `second`
    with django_capture_on_commit_callbacks(execute=True):
        tenant.client.delete(f"/api/v1/datasets/{second['id']}/")
    assert not Blob.objects.filter(organization=tenant.organization).exists()
    assert storage.blob_exists(sha)  # the other organization stores the same bytes
    with django_capture_on_commit_callbacks(execute=True):
        other.client.delete(f"/api/v1/datasets/{theirs['id']}/")
    assert not storage.blob_exists(sha)


def test_a_validation_set_is_not_a_calibration_set(tenant, model_files):
    version = upload(tenant.client, "/api/v1/models/", model_files["model"]).json()["versions"][0]["id"]
    validation = upload(tenant.client, "/api/v1/datasets/", model_files["validation"], kind="validation").json()["id"]
    response = tenant.client.post("/api/v1/jobs/", {"model_version": version, "precisions": ["int8"], "calibration_dataset": validation}, format="json")
    body = assert_json_error(response, 400, "dataset_kind")
    assert "validation set" in body["error"]
    assert DeploymentJob.objects.count() == 0


def huge_input_model(dims: list) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "huge",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_models_with_huge_declared_inputs_are_refused_at_upload(tenant, tmp_path, settings):
    path = tmp_path / "huge.onnx"
    onnx.save(huge_input_model(["batch", 3, 100_000, 100_000]), path)
    body = assert_json_error(upload(tenant.client, "/api/v1/models/", path), 400, "input_too_large")
    assert "30,000,000,000" in body["error"] and "KILN_MAX_INPUT_ELEMENTS" in body["error"]
    assert f"{settings.MAX_INPUT_ELEMENTS:,}" in body["error"]
    assert Model.objects.count() == 0 and Blob.objects.count() == 0


def test_symbolic_dimensions_do_not_count_against_the_limit(tenant, tmp_path):
    path = tmp_path / "dynamic.onnx"
    onnx.save(huge_input_model(["batch", 3, "height", "width"]), path)
    assert upload(tenant.client, "/api/v1/models/", path).status_code == 201
