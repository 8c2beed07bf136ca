"""With S3 (a real moto server process), an agent's task files and engine uploads are presigned URLs
issued only to the agent holding the task's lease, for one object each."""
from __future__ import annotations

import hashlib
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from tests.conftest import make_tenant
from tests.fixtures.s3 import BUCKET
from tests.platform.fleet.test_fleet import ORT_ONLY, lease, private_storage, register, waiting_job  # noqa: F401

# The lease long-poll reads the database from executor threads: they must see committed rows.
pytestmark = pytest.mark.django_db(transaction=True)


def test_task_files_are_presigned_urls_for_the_lease_holder_only(s3_storage, tenant, waiting_job):  # noqa: F811
    holder = register(tenant, "box", ORT_ONLY)
    task = lease(holder).json()
    model = task["files"]["model"]
    response = holder.get(model["url"])
    assert response.status_code == 302
    location = urlsplit(response["Location"])
    assert location.path == f"/{BUCKET}/{model['sha256'][:2]}/{model['sha256']}"
    assert parse_qs(location.query)["X-Amz-Expires"] == ["60"]
    assert hashlib.sha256(requests.get(response["Location"], timeout=30).content).hexdigest() == model["sha256"]

    stranger = register(make_tenant(username="eve", organization="Evil"), "evil", ORT_ONLY)
    bystander = register(tenant, "not-holder", ORT_ONLY)
    plan = {"attempt": task["attempt"], "sha256": "0" * 64, "size_bytes": 10}
    for client, status in ((stranger, 404), (bystander, 409)):
        refused = client.get(model["url"])
        assert refused.status_code == status and "Location" not in refused
        planned = client.post(f"/api/agent/v1/tasks/{task['id']}/artifact-upload", plan, format="json")
        assert planned.status_code == status and "url" not in planned.json()

    granted = holder.post(f"/api/agent/v1/tasks/{task['id']}/artifact-upload", plan, format="json").json()
    assert granted["method"] == "PUT" and urlsplit(granted["url"]).path.startswith(f"/{BUCKET}/incoming/task{task['id']}-attempt")
    forged = bystander.post(f"/api/agent/v1/tasks/{task['id']}/artifact", {"attempt": task["attempt"], "staged": granted["staged"]}, format="json")
    assert forged.status_code == 400 and forged.json()["code"] == "invalid_staged_token", "a token works only for the agent it was issued to"

    finished = holder.post(f"/api/agent/v1/tasks/{task['id']}/result", {"attempt": task["attempt"], "status": "failed", "error": "x"}, format="json")
    assert finished.status_code == 200
    late = holder.get(model["url"])
    assert late.status_code == 409 and "Location" not in late
