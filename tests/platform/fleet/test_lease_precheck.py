"""The lease pre-check: an idle look skips the database, and nothing that makes work leasable is missed."""
from __future__ import annotations

import threading

import pytest

from kiln.fleet.selectors import agent_from_secret
from kiln.fleet.services import device_task_lease_once
from kiln.pipeline.models import DeviceTask, DeviceTaskStatus
from tests.platform.fleet.test_fleet import ORT_ONLY, create_job, lease, private_storage, register  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def agent_of(client):
    return agent_from_secret(secret=client._credentials["HTTP_AUTHORIZATION"].split()[1])


def test_an_empty_look_is_remembered_and_a_dispatch_is_still_leased_at_once(tenant, model_files, django_assert_num_queries):
    agent = register(tenant, "box", ORT_ONLY)
    assert lease(agent).status_code == 204
    with django_assert_num_queries(0):
        assert device_task_lease_once(agent=agent_of(agent)) is None
    job = create_job(tenant, model_files, precisions=["fp32"])
    leased = lease(agent)
    assert leased.status_code == 200 and leased.json()["job"] == job


def test_a_waiting_long_poll_wakes_for_a_task_queued_after_its_empty_look(tenant, model_files, settings):
    settings.AGENT_LONG_POLL_SECONDS = 60
    agent = register(tenant, "box", ORT_ONLY)
    assert lease(agent).status_code == 204
    answers = []
    waiter = threading.Thread(target=lambda: answers.append(lease(agent, wait_s=60)))
    waiter.start()
    job = create_job(tenant, model_files, precisions=["fp32"])
    waiter.join(timeout=90)
    assert answers and answers[0].status_code == 200 and answers[0].json()["job"] == job


def test_a_requeued_task_is_leased_again_despite_the_remembered_empty_look(tenant, model_files):
    first, second = register(tenant, "first", ORT_ONLY), register(tenant, "second", ORT_ONLY)
    create_job(tenant, model_files, precisions=["fp32"], targets=[first.agent_id])
    task = lease(first).json()
    assert lease(second).status_code == 204  # nothing for it: remembered
    # The holder asks for work again (it restarted): its task is handed back and can be leased again.
    assert lease(first).json()["id"] == task["id"]


def test_a_cancel_reaches_a_cached_agent_through_heartbeat_and_its_next_long_poll_gets_nothing(tenant, model_files, settings):
    settings.AGENT_AUTH_CACHE_SECONDS = 3600
    agent = register(tenant, "box", ORT_ONLY)
    job = create_job(tenant, model_files, precisions=["fp32", "int8-dynamic"])
    task = lease(agent).json()
    assert agent.post("/api/agent/v1/heartbeat", {"running_task": task["id"]}, format="json").json()["cancel"] == []
    assert tenant.client.post(f"/api/v1/jobs/{job}/cancel/").status_code == 200
    assert agent.post("/api/agent/v1/heartbeat", {"running_task": task["id"]}, format="json").json()["cancel"] == [task["id"]]
    assert agent.post("/api/agent/v1/heartbeat", {}, format="json").json()["cancel"] == []
    assert lease(agent).status_code == 204
    assert not DeviceTask.objects.filter(job_id=job, status=DeviceTaskStatus.QUEUED).exists()
