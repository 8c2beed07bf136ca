"""Batched heartbeats: noted in memory, written in one UPDATE, and read the same everywhere."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from kiln.fleet import heartbeats, token_cache
from kiln.fleet.models import Agent
from kiln.fleet.selectors import agent_from_secret, agents_online_count
from kiln.fleet.services import agent_heartbeat_idle, agents_mark_offline
from tests.platform.fleet.test_fleet import ORT_ONLY, register

# Transactional: the flusher writes from its own thread and must see committed agents.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def no_pending_heartbeats():
    heartbeats.heartbeats_flush()
    yield
    heartbeats.heartbeats_flush()


def secret_of(client) -> str:
    return client._credentials["HTTP_AUTHORIZATION"].split()[1]


def test_an_idle_heartbeat_is_noted_without_a_query_and_reaches_the_database_in_the_batch(tenant, django_assert_num_queries):
    first, second = register(tenant, "first", ORT_ONLY), register(tenant, "second", ORT_ONLY)
    long_ago = timezone.now() - timedelta(seconds=40)
    Agent.objects.update(last_heartbeat_at=long_ago)
    agent = agent_from_secret(secret=secret_of(first))
    with django_assert_num_queries(0):
        assert agent_heartbeat_idle(agent=agent, capabilities=agent.capabilities, running_task=None)
    assert first.post("/api/agent/v1/heartbeat", {}, format="json").status_code == 200
    assert second.post("/api/agent/v1/heartbeat", {"capabilities": ORT_ONLY}, format="json").status_code == 200
    # This process shows the noted heartbeat before (or after) the flusher wrote it.
    shown = tenant.client.get(f"/api/v1/agents/{first.agent_id}/").json()
    assert shown["online"] is True and shown["last_heartbeat_at"] > long_ago.isoformat()
    heartbeats.heartbeats_flush()
    assert all(seen > long_ago for seen in Agent.objects.values_list("last_heartbeat_at", flat=True))


def test_the_flusher_thread_writes_heartbeats_by_itself(tenant):
    agent = register(tenant, "box", ORT_ONLY)
    long_ago = timezone.now() - timedelta(seconds=40)
    Agent.objects.filter(pk=agent.agent_id).update(last_heartbeat_at=long_ago)
    assert agent.post("/api/agent/v1/heartbeat", {}, format="json").status_code == 200
    deadline = time.monotonic() + 30
    while Agent.objects.get(pk=agent.agent_id).last_heartbeat_at <= long_ago:
        assert time.monotonic() < deadline, "no flush within 30 s"
        time.sleep(0.1)
    assert heartbeats.heartbeats_pending() == {}


def test_an_agent_with_a_pending_heartbeat_is_not_marked_offline_and_a_silent_one_is(tenant):
    alive, silent = register(tenant, "alive", ORT_ONLY), register(tenant, "silent", ORT_ONLY)
    Agent.objects.update(last_heartbeat_at=timezone.now() - timedelta(seconds=59))
    assert alive.post("/api/agent/v1/heartbeat", {}, format="json").status_code == 200
    Agent.objects.update(last_heartbeat_at=timezone.now() - timedelta(hours=1))  # as the database may lag
    assert agents_mark_offline() == 1
    assert Agent.objects.get(pk=silent.agent_id).offline_since is not None
    assert tenant.client.get(f"/api/v1/agents/{alive.agent_id}/").json()["online"] is True
    assert tenant.client.get(f"/api/v1/agents/{silent.agent_id}/").json()["online"] is False
    assert agents_online_count() == 1
    heartbeats.heartbeats_flush()
    assert Agent.objects.get(pk=alive.agent_id).offline_since is None and Agent.objects.get(pk=alive.agent_id).online


def test_a_heartbeat_back_from_offline_or_with_new_capabilities_is_written_at_once(tenant, settings):
    settings.AGENT_AUTH_CACHE_SECONDS = 3600
    agent = register(tenant, "box", ORT_ONLY)
    assert agent.post("/api/agent/v1/heartbeat", {}, format="json").status_code == 200  # caches the token
    heartbeats.heartbeats_flush()
    # An hour of silence: the token cache has long forgotten the agent, and the beat marked it offline.
    token_cache.clear()
    Agent.objects.filter(pk=agent.agent_id).update(offline_since=timezone.now(), last_heartbeat_at=timezone.now() - timedelta(hours=1))
    assert agent.post("/api/agent/v1/heartbeat", {}, format="json").status_code == 200
    row = Agent.objects.get(pk=agent.agent_id)
    assert row.offline_since is None and row.online
    more = {**ORT_ONLY, "runtimes": {"onnxruntime": "1.32", "openvino": "2026.4"}}
    assert agent.post("/api/agent/v1/heartbeat", {"capabilities": more}, format="json").status_code == 200
    assert Agent.objects.get(pk=agent.agent_id).backends == {"onnxruntime", "openvino"}
