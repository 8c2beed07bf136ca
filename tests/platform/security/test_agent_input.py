"""Every field an agent sends is typed and bounded; a bad stored result cannot break a report."""
from __future__ import annotations

import json

import pytest

from kiln.fleet.models import Agent
from kiln.pipeline.models import DeviceTask, DeviceTaskStatus
from kiln.reports.selectors import job_report
from tests.platform.security.conftest import CAPABILITIES, assert_json_error, register_agent

pytestmark = pytest.mark.django_db
# Tests that lease or heartbeat run transactional: those async views read the database from their own thread.
LEASES = pytest.mark.django_db(transaction=True)

GOOD_METRICS = {"latency_ms": {"p50": 1.0, "p90": 1.2, "p99": 1.5, "mean": 1.1, "std": 0.1}, "throughput_per_s": 900.0}


@LEASES
@pytest.mark.parametrize(
    "capabilities",
    [
        {"runtimes": 5},
        {"runtimes": ["onnxruntime"]},
        {"runtimes": {"onnxruntime": {"version": "1"}}},
        {"cores": "many"},
        {"cores": -2},
        {"isa": "avx2"},
        {"memory_mb": 1e300},
        {"gpu": "yes"},
        {"runtimes": {f"r{i}": "1" for i in range(100)}},
    ],
)
def test_mistyped_capabilities_are_refused_at_registration_and_heartbeat(tenant, capabilities):
    secret = tenant.client.post("/api/v1/agents/registration-tokens/", {"name": "lab"}, format="json").json()["token"]
    from rest_framework.test import APIClient

    response = APIClient().post("/api/agent/v1/register", {"registration_token": secret, "name": "bad", "capabilities": capabilities}, format="json")
    assert_json_error(response, 400)
    assert not Agent.objects.filter(name="bad").exists()
    agent = register_agent(tenant)
    assert_json_error(agent.post("/api/agent/v1/heartbeat", {"capabilities": capabilities}, format="json"), 400)
    assert Agent.objects.get(pk=agent.agent_id).capabilities["runtimes"] == CAPABILITIES["runtimes"]
    # The agent still leases normally afterwards.
    assert agent.post("/api/agent/v1/tasks/lease", {"wait_s": 0}, format="json").status_code in (200, 204)


@LEASES
def test_unknown_capability_keys_are_dropped_so_rows_stay_small(tenant, settings):
    agent = register_agent(tenant)
    bloated = {**CAPABILITIES, **{f"junk{i}": "x" * 1000 for i in range(500)}}
    settings.MAX_JSON_BYTES = 8 * 1024**2
    assert agent.post("/api/agent/v1/heartbeat", {"capabilities": bloated}, format="json").status_code == 200
    stored = Agent.objects.get(pk=agent.agent_id).capabilities
    assert not any(key.startswith("junk") for key in stored)
    assert len(json.dumps(tenant.client.get("/api/v1/agents/").json())) < 10_000


@LEASES
def test_nine_megabyte_capabilities_are_refused(tenant):
    agent = register_agent(tenant)
    payload = {"capabilities": {**CAPABILITIES, "cpu_model": "x" * (9 * 1024**2)}}
    assert_json_error(agent.post("/api/agent/v1/heartbeat", payload, format="json"), 413)


@LEASES
@pytest.mark.parametrize(
    "metrics",
    [
        {"latency_ms": "fast"},
        {"latency_ms": {"p50": "abc"}},
        {"latency_ms": {"p50": -1.0}},
        {"latency_ms": {"p90": 1.0}},
        {"latency_ms": {"p50": 1.0}, "throughput_per_s": "lots"},
        {"latency_ms": {"p50": 1.0}, "by_batch": [{"batch_size": 0, "latency_ms": {"p50": 1}}]},
        {"latency_ms": {"p50": 1.0}, "unstable": "maybe"},
    ],
)
def test_mistyped_metrics_are_refused_and_nothing_is_stored(agent, leased_task, metrics):
    url = f"/api/agent/v1/tasks/{leased_task['id']}/result"
    assert_json_error(agent.post(url, {"attempt": leased_task["attempt"], "status": "succeeded", "metrics": metrics}, format="json"), 400)
    task = DeviceTask.objects.get(pk=leased_task["id"])
    assert task.status == DeviceTaskStatus.LEASED and task.metrics == {}


@LEASES
@pytest.mark.parametrize(
    "extra",
    [
        {"accuracy": {"cosine": "high"}},
        {"accuracy": {"sqnr_db": True}},
        {"accuracy": "good"},
        {"profile": {"by_op_type": [{"op_type": "Conv", "time_ms": "slow"}]}},
        {"profile": {"by_node": "all"}},
    ],
)
def test_mistyped_accuracy_and_profile_are_refused(agent, leased_task, extra):
    url = f"/api/agent/v1/tasks/{leased_task['id']}/result"
    body = {"attempt": leased_task["attempt"], "status": "succeeded", "metrics": GOOD_METRICS, **extra}
    assert_json_error(agent.post(url, body, format="json"), 400)
    assert DeviceTask.objects.get(pk=leased_task["id"]).status == DeviceTaskStatus.LEASED


@LEASES
def test_long_errors_and_logs_are_kept_truncated_not_refused(agent, leased_task):
    url = f"/api/agent/v1/tasks/{leased_task['id']}/result"
    body = {"attempt": leased_task["attempt"], "status": "failed", "error": "E" * 100_000, "log": "L" * 500_000 + "last line"}
    assert agent.post(url, body, format="json").status_code == 200
    task = DeviceTask.objects.get(pk=leased_task["id"])
    assert len(task.error) <= 8 * 1024 and task.log.endswith("last line") and len(task.log) <= 64 * 1024


@LEASES
def test_report_renders_when_a_stored_result_is_unreadable(tenant, agent, leased_task):
    # A row stored before results were type-checked: the report shows the error for that entry.
    DeviceTask.objects.filter(pk=leased_task["id"]).update(
        status=DeviceTaskStatus.SUCCEEDED, metrics={"latency_ms": {"p50": "abc"}}, accuracy={"cosine": "x"}
    )
    task = DeviceTask.objects.get(pk=leased_task["id"])
    report = job_report(job=task.job)
    (entry,) = report["devices"][0]["variants"]
    assert entry["latency_ms"] is None
    assert "cannot be read" in entry["error"]
    response = tenant.client.get(f"/api/v1/jobs/{task.job_id}/report/")
    assert response.status_code == 200
    assert "cannot be read" in response.json()["devices"][0]["variants"][0]["error"]


def test_a_profile_keeps_how_many_warm_up_runs_the_agent_left_out_and_refuses_a_negative_count():
    from kiln.fleet.api.serializers import ProfileSerializer

    kept = ProfileSerializer(data={"by_op_type": [], "runs": 10, "warmup_runs": 1, "total_ms": 0.5})
    assert kept.is_valid(), kept.errors
    assert kept.validated_data["warmup_runs"] == 1
    assert not ProfileSerializer(data={"warmup_runs": -1}).is_valid()
