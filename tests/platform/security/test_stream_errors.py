"""An error from the job event stream is JSON and says so, even to a client that accepts only
`text/event-stream` (EventSource): a 404 for another organization's job, a 401 without credentials."""
from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("who", ["stranger", "anonymous"])
def test_stream_errors_are_json(tenant, other_tenant, who):
    client = other_tenant.client if who == "stranger" else APIClient()
    response = client.get("/api/v1/jobs/123456/stream/", HTTP_ACCEPT="text/event-stream")
    assert response.status_code == (404 if who == "stranger" else 401)
    assert response["Content-Type"] == "application/json", response["Content-Type"]
    assert json.loads(response.content)["code"] in ("not_found", "not_authenticated")
