"""Every API resource is checked the same way: anonymous gets 401, another organization gets 404."""
from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from kiln.fleet.services import agent_register, registration_token_create
from kiln.pipeline.models import Artifact, ArtifactKind
from kiln.registry.services import blob_create
from tests.conftest import upload

pytestmark = pytest.mark.django_db


@pytest.fixture
def owned(tenant, model_files, settings, tmp_path):
    """One object of every kind, owned by `tenant`."""
    settings.BLOB_ROOT = tmp_path / "blobs"
    model = upload(tenant.client, "/api/v1/models/", model_files["model"], name="secret-model").json()
    dataset = upload(tenant.client, "/api/v1/datasets/", model_files["calibration"], kind="calibration").json()
    job = tenant.client.post(
        "/api/v1/jobs/", {"model_version": model["versions"][0]["id"], "precisions": ["fp32"], "calibration_dataset": dataset["id"]}, format="json"
    ).json()
    registration, secret = registration_token_create(organization=tenant.organization, user=tenant.user, name="r")
    agent, _ = agent_register(registration_secret=secret, name="box", labels={}, capabilities={"runtimes": {"onnxruntime": "1"}})
    from kiln.pipeline.models import DeploymentJob

    job_row = DeploymentJob.objects.get(pk=job["id"])
    artifact = Artifact.objects.create(
        organization=tenant.organization, job=job_row, kind=ArtifactKind.CONVERTED, name="converted.onnx",
        blob=blob_create(organization=tenant.organization, path=model_files["model"]),
    )
    token = tenant.client.post("/api/v1/tokens/", {"name": "t"}, format="json").json()
    from kiln.accounts.models import Membership

    membership = Membership.objects.get(user=tenant.user, organization=tenant.organization)
    upload_url = tenant.client.post("/api/v1/uploads/", HTTP_UPLOAD_LENGTH="10", HTTP_TUS_RESUMABLE="1.0.0")["Location"]
    return {"upload": upload_url, "membership": membership, "model": model, "dataset": dataset, "job": job, "agent": agent, "registration": registration, "artifact": artifact, "token": token}


def object_routes(owned) -> list[tuple[str, str]]:
    model_id = owned["model"]["id"]
    job_id = owned["job"]["id"]
    return [
        ("get", f"/api/v1/models/{model_id}/"),
        ("get", f"/api/v1/models/{model_id}/versions/"),
        ("get", f"/api/v1/models/{model_id}/versions/1/download/"),
        ("post", f"/api/v1/models/{model_id}/versions/"),
        ("delete", f"/api/v1/models/{model_id}/"),
        ("get", f"/api/v1/datasets/{owned['dataset']['id']}/"),
        ("delete", f"/api/v1/datasets/{owned['dataset']['id']}/"),
        ("get", f"/api/v1/jobs/{job_id}/"),
        ("post", f"/api/v1/jobs/{job_id}/cancel/"),
        ("post", f"/api/v1/jobs/{job_id}/rerun/"),
        ("get", f"/api/v1/performance/estimate/?model_version={owned['model']['versions'][0]['id']}"),
        ("get", owned["upload"]),
        ("patch", owned["upload"]),
        ("delete", owned["upload"]),
        ("get", f"/api/v1/jobs/{job_id}/artifacts/"),
        ("get", f"/api/v1/jobs/{job_id}/report/"),
        ("get", f"/api/v1/artifacts/{owned['artifact'].id}/download/"),
        ("get", f"/api/v1/agents/{owned['agent'].id}/"),
        ("post", f"/api/v1/agents/{owned['agent'].id}/revoke/"),
        ("post", f"/api/v1/agents/registration-tokens/{owned['registration'].id}/revoke/"),
        ("post", f"/api/v1/tokens/{owned['token']['id']}/revoke/"),
        ("patch", f"/api/v1/members/{owned['membership'].id}/"),
        ("delete", f"/api/v1/members/{owned['membership'].id}/"),
    ]


LIST_ROUTES = ["/api/v1/models/", "/api/v1/datasets/", "/api/v1/jobs/", "/api/v1/agents/", "/api/v1/agents/registration-tokens/", "/api/v1/tokens/", "/api/v1/members/"]


def _ids(body) -> set:
    rows = body["results"] if isinstance(body, dict) else body
    return {row["id"] for row in rows}


class TestTenantIsolation:
    def test_other_organization_gets_404_on_every_object_route(self, owned, other_tenant):
        for method, url in object_routes(owned):
            response = getattr(other_tenant.client, method)(url)
            assert response.status_code == 404, f"{method.upper()} {url} answered {response.status_code}"
            assert response.json()["error"]

    def test_other_organization_lists_show_none_of_ours(self, owned, other_tenant, tenant):
        for url in LIST_ROUTES:
            theirs = _ids(other_tenant.client.get(url).json())
            ours = _ids(tenant.client.get(url).json())
            assert ours, f"{url} shows the owner nothing"
            assert not theirs & ours, f"{url} leaked {theirs & ours}"

    def test_anonymous_gets_401_everywhere(self, owned):
        client = APIClient()
        for method, url in object_routes(owned) + [("get", u) for u in LIST_ROUTES]:
            assert getattr(client, method)(url).status_code == 401, url

    def test_owner_still_sees_everything(self, owned, tenant):
        for method, url in object_routes(owned):
            if method == "get":
                assert tenant.client.get(url).status_code == 200, url

    def test_job_cannot_use_another_organizations_objects(self, owned, other_tenant, model_files):
        mine = upload(other_tenant.client, "/api/v1/models/", model_files["model"]).json()
        stolen_version = other_tenant.client.post("/api/v1/jobs/", {"model_version": owned["model"]["versions"][0]["id"]}, format="json")
        assert stolen_version.status_code == 404
        stolen_dataset = other_tenant.client.post(
            "/api/v1/jobs/", {"model_version": mine["versions"][0]["id"], "calibration_dataset": owned["dataset"]["id"]}, format="json"
        )
        assert stolen_dataset.status_code == 404
        stolen_agent = other_tenant.client.post("/api/v1/jobs/", {"model_version": mine["versions"][0]["id"], "targets": [owned["agent"].id]}, format="json")
        assert stolen_agent.status_code == 400
