"""Deeply nested and oversized JSON bodies are 4xx JSON errors, and nothing is stored."""
from __future__ import annotations

import pytest

from kiln.fleet.models import Agent
from kiln.pipeline.models import DeploymentJob, DeviceTask
from tests.platform.security.conftest import assert_json_error

pytestmark = pytest.mark.django_db
# Tests that lease or heartbeat run transactional: those async views read the database from their own thread.
LEASES = pytest.mark.django_db(transaction=True)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def nested_object(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


@pytest.mark.parametrize("body", [nested(100_000), nested_object(5_000), nested(40)])
def test_nested_job_body_is_a_400(tenant, model_version, body):
    response = tenant.client.post("/api/v1/jobs/", body, content_type="application/json")
    body = assert_json_error(response, 400, "parse_error")
    assert "nested too deeply" in body["error"]
    assert DeploymentJob.objects.count() == 0


def test_nested_tolerance_inside_a_valid_job_is_a_400(tenant, model_version):
    payload = '{"model_version": %d, "tolerance": %s}' % (model_version, nested_object(2_000))
    assert_json_error(tenant.client.post("/api/v1/jobs/", payload, content_type="application/json"), 400, "parse_error")
    assert DeploymentJob.objects.count() == 0


@LEASES
def test_nested_heartbeat_is_a_400_and_keeps_capabilities(agent):
    before = Agent.objects.get(pk=agent.agent_id).capabilities
    payload = '{"capabilities": {"runtimes": %s}}' % nested(50_000)
    assert_json_error(agent.post("/api/agent/v1/heartbeat", payload, content_type="application/json"), 400, "parse_error")
    assert Agent.objects.get(pk=agent.agent_id).capabilities == before


@LEASES
def test_nested_result_is_a_400_and_the_task_stays_leased(agent, leased_task):
    payload = '{"attempt": %d, "status": "succeeded", "metrics": %s}' % (leased_task["attempt"], nested_object(3_000))
    response = agent.post(f"/api/agent/v1/tasks/{leased_task['id']}/result", payload, content_type="application/json")
    assert_json_error(response, 400, "parse_error")
    task = DeviceTask.objects.get(pk=leased_task["id"])
    assert task.status == "leased" and task.metrics == {}


def test_json_body_over_the_route_limit_is_a_413(tenant, model_version, settings):
    settings.MAX_JSON_BYTES = 4096
    payload = '{"model_version": %d, "precisions": ["fp32"], "targets": [%s]}' % (model_version, ",".join(["1"] * 3000))
    body = assert_json_error(tenant.client.post("/api/v1/jobs/", payload, content_type="application/json"), 413, "request_too_large")
    assert "KILN_MAX_JSON_BYTES" in body["error"]
    assert DeploymentJob.objects.count() == 0


@LEASES
def test_agent_results_have_their_own_larger_limit(agent, leased_task, settings):
    settings.MAX_JSON_BYTES = 4096
    settings.MAX_AGENT_RESULT_BYTES = 256 * 1024
    result = {"attempt": leased_task["attempt"], "status": "failed", "error": "x", "log": "line\n" * 10_000}
    response = agent.post(f"/api/agent/v1/tasks/{leased_task['id']}/result", result, format="json")
    assert response.status_code == 200, response.content
    too_big = {"attempt": leased_task["attempt"], "status": "failed", "log": "y" * 300_000}
    assert_json_error(agent.post(f"/api/agent/v1/tasks/{leased_task['id']}/result", too_big, format="json"), 413, "request_too_large")


@LEASES
def test_heartbeat_body_over_the_limit_is_a_413(agent, settings):
    settings.MAX_JSON_BYTES = 4096
    payload = {"capabilities": {"cpu_model": "x" * 10_000}}
    assert_json_error(agent.post("/api/agent/v1/heartbeat", payload, format="json"), 413, "request_too_large")


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_standard_json_constants_are_refused(tenant, model_version, constant):
    payload = '{"model_version": %d, "tolerance": {"metric": "cosine", "max_drop": %s}}' % (model_version, constant)
    assert_json_error(tenant.client.post("/api/v1/jobs/", payload, content_type="application/json"), 400, "parse_error")
    assert DeploymentJob.objects.count() == 0
