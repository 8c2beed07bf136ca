"""Fixtures for the hostile-input tests: a registered agent and a job with a leased device task."""
from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tests.conftest import upload

CAPABILITIES = {"runtimes": {"onnxruntime": "1.32"}, "cores": 2, "os": "linux"}


@pytest.fixture(autouse=True)
def private_storage(settings, tmp_path):
    settings.BLOB_ROOT = tmp_path / "blobs"
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.AGENT_LONG_POLL_SECONDS = 0


def register_agent(tenant, name: str = "probe", capabilities: dict | None = None) -> APIClient:
    secret = tenant.client.post("/api/v1/agents/registration-tokens/", {"name": "lab"}, format="json").json()["token"]
    response = APIClient().post(
        "/api/agent/v1/register",
        {"registration_token": secret, "name": name, "capabilities": capabilities or CAPABILITIES},
        format="json",
    )
    assert response.status_code == 201, response.content
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {response.json()['agent_token']}")
    client.agent_id = response.json()["agent_id"]
    return client


@pytest.fixture
def agent(tenant) -> APIClient:
    return register_agent(tenant)


@pytest.fixture
def model_version(tenant, model_files) -> int:
    return upload(tenant.client, "/api/v1/models/", model_files["model"]).json()["versions"][0]["id"]


@pytest.fixture
def leased_task(tenant, agent, model_version) -> dict:
    """A job whose fp32 variant waits for a device, leased by `agent` (tests using it run
    transactional, so the eager pipeline runs as each step commits)."""
    job = tenant.client.post("/api/v1/jobs/", {"model_version": model_version, "precisions": ["fp32"]}, format="json")
    assert job.status_code == 201, job.content
    response = agent.post("/api/agent/v1/tasks/lease", {"wait_s": 0}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def assert_json_error(response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, (response.status_code, response.content[:500])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert isinstance(body.get("error"), str) and body["error"], body
    assert isinstance(body.get("code"), str), body
    if code is not None:
        assert body["code"] == code, body
    return body
