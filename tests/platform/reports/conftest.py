"""A fake agent over the real agent API, so that jobs end with reports, measurements and packages."""
from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from kiln.pipeline.models import DeploymentJob
from tests.conftest import upload

CAPABILITIES = {"runtimes": {"onnxruntime": "1.32.0"}, "cores": 2, "cpu_model": "Test CPU", "agent_version": "0.1.0"}


@pytest.fixture(autouse=True)
def eager(settings, tmp_path):
    settings.BLOB_ROOT = tmp_path / "blobs"
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.AGENT_LONG_POLL_SECONDS = 0


def register(tenant, name: str, capabilities: dict | None = None) -> APIClient:
    secret = tenant.client.post("/api/v1/agents/registration-tokens/", {"name": "lab"}, format="json").json()["token"]
    body = APIClient().post("/api/agent/v1/register", {"registration_token": secret, "name": name, "capabilities": capabilities or CAPABILITIES}, format="json").json()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {body['agent_token']}")
    return client


def measure(agent: APIClient, capture, *, p50: float, std: float) -> None:
    """Lease every task of the agent's queue and report the given latency with a two-operator profile."""
    while (response := agent.post("/api/agent/v1/tasks/lease", {"wait_s": 0}, format="json")).status_code == 200:
        task = response.json()
        result = {
            "attempt": task["attempt"], "status": "succeeded", "error": "",
            "metrics": {"latency_ms": {"p50": p50, "p90": p50, "p99": p50, "mean": p50, "std": std, "cv": std / p50, "count": 50}, "runs": 50,
                        "threads": 1, "batch_size": 1, "peak_memory_mb": 10.0, "throughput_per_s": 1000 / p50},
            "accuracy": {"cosine": 1.0, "sqnr_db": 90.0, "top1_agreement": 1.0, "max_abs_error": 0.0},
            "profile": {"by_op_type": [{"op_type": "Conv", "time_ms": 0.75 * p50, "count": 2}, {"op_type": "Gemm", "time_ms": 0.25 * p50, "count": 2}]},
        }
        with capture(execute=True):
            assert agent.post(f"/api/agent/v1/tasks/{task['id']}/result", result, format="json").status_code == 200


@pytest.fixture
def measured_job(tenant, model_files, django_capture_on_commit_callbacks):
    """An fp32 job of the digits CNN measured by one (scripted) agent: p50 1 ms."""
    agent = register(tenant, "bench-box")
    version = upload(tenant.client, "/api/v1/models/", model_files["model"], name="digits").json()["versions"][0]["id"]
    with django_capture_on_commit_callbacks(execute=True):
        job = tenant.client.post("/api/v1/jobs/", {"model_version": version, "precisions": ["fp32"]}, format="json").json()
    measure(agent, django_capture_on_commit_callbacks, p50=1.0, std=0.02)
    assert DeploymentJob.objects.get(pk=job["id"]).status == "succeeded"
    return {"job": job["id"], "version": version, "agent": agent}
