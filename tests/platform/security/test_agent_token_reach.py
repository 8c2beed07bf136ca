"""A stolen agent token reaches only the agent protocol of its own organization: no user route, no
other organization's tasks, no upload of another agent."""
from __future__ import annotations

import pytest

from tests.platform.security.conftest import assert_json_error, register_agent
from tests.platform.test_tenancy import LIST_ROUTES

pytestmark = pytest.mark.django_db

TUS = {"HTTP_TUS_RESUMABLE": "1.0.0"}


@pytest.mark.parametrize("route", [*LIST_ROUTES, "/api/v1/packages/key/", "/api/v1/storage/", "/api/v1/auth/me/"])
def test_an_agent_token_opens_no_user_route(agent, route):
    assert agent.get(route).status_code == 401


@pytest.mark.django_db(transaction=True)  # the lease view reads the database from its own thread
def test_an_agent_sees_no_task_of_another_organization(tenant, other_tenant, leased_task):
    stranger = register_agent(other_tenant, name="stranger")
    for path in (f"/api/agent/v1/tasks/{leased_task['id']}/files/model", f"/api/agent/v1/tasks/{leased_task['id']}/progress"):
        response = stranger.post(path, {"attempt": leased_task["attempt"], "stage": "x", "message": ""}, format="json") \
            if path.endswith("progress") else stranger.get(path)
        assert_json_error(response, 404)


def test_an_agent_cannot_touch_another_agent_s_upload(tenant, agent):
    other = register_agent(tenant, name="other")
    created = agent.post("/api/agent/v1/uploads", HTTP_UPLOAD_LENGTH="4", **TUS)
    assert created.status_code == 201
    url = created["Location"]
    assert other.get(url, **TUS).status_code == 404
    assert other.delete(url, **TUS).status_code == 404
    assert agent.get(url, **TUS).status_code == 200
