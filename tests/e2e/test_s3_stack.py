"""End to end on S3-compatible storage (a real moto server process): live server, a Celery worker
process and a kiln-agent process; the agent's files move through presigned URLs, not the server."""
from __future__ import annotations

import hashlib

import pytest

from tests.conftest import wait_until
from tests.e2e.test_pipeline_stack import Api, upload_digits
from tests.fixtures.s3 import BUCKET

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def s3_stack(transactional_db, s3_storage, monkeypatch, request):
    """kiln_stack whose server (this process) and worker process both store blobs in the S3 server."""
    for name, value in s3_storage.env().items():
        monkeypatch.setenv(name, value)
    return request.getfixturevalue("kiln_stack")


def _key(sha256: str) -> str:
    return f"{sha256[:2]}/{sha256}"


def test_a_job_on_s3_storage_succeeds_with_the_agent_moving_files_through_presigned_urls(s3_stack, s3_storage, model_files, settings):
    tenant = s3_stack.create_user("sam", "a-long-password-1", "S3 Lab")
    api = Api(s3_stack.url, tenant.token)
    ids = upload_digits(api, model_files)
    agent = s3_stack.start_agent(tenant, "s3-agent")
    wait_until(lambda: any(a["online"] for a in api.get("/api/v1/agents/").json()), timeout=30, message="the agent online")
    job = api.post("/api/v1/jobs/", json={"model_version": ids["version"], "precisions": ["fp32"],
                                          "calibration_dataset": ids["calibration"], "validation_dataset": ids["validation"]})
    job = api.wait_for_job(job["id"], s3_stack)
    assert job["status"] == "succeeded", (job["error"], job["events"], s3_stack.logs())

    artifacts = api.get(f"/api/v1/jobs/{job['id']}/artifacts/").json()
    compiled = [a for a in artifacts if a["kind"] == "compiled"]
    assert compiled, artifacts
    stored = s3_storage.object_keys()
    for artifact in artifacts:
        assert _key(artifact["sha256"]) in stored, f"{artifact['name']} is not in the bucket"
    for artifact in compiled:
        assert hashlib.sha256(s3_storage.read(_key(artifact["sha256"]))).hexdigest() == artifact["sha256"]
        # A script follows the redirect to storage (its bearer token stays with the server).
        assert hashlib.sha256(api.get(artifact["download_url"]).content).hexdigest() == artifact["sha256"]
    assert s3_storage.object_keys("incoming/") == [], "staged uploads are removed once verified"
    assert not list(settings.BLOB_ROOT.glob("[0-9a-f][0-9a-f]/*")), "with S3 the folder holds no stored copy"

    # What S3 saw: the agent fetched the task's model by a presigned GET and put its engine by a presigned PUT.
    model_artifact = next(a for a in artifacts if a["name"] == "fp32.onnx")
    requests_seen = s3_storage.requests_logged()
    assert any(line.startswith(f"GET /{BUCKET}/{_key(model_artifact['sha256'])}?") and "X-Amz-Signature=" in line
               for line in requests_seen), requests_seen[-20:]
    assert any(line.startswith(f"PUT /{BUCKET}/incoming/task") and "X-Amz-Signature=" in line for line in requests_seen), requests_seen[-20:]
    assert agent.poll() is None
