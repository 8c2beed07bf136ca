"""Server-chosen intervals: the floors for a small fleet, stretched for a large one, within their ceilings."""
from __future__ import annotations

import pytest

from kiln.fleet import intervals
from tests.platform.fleet.test_fleet import ORT_ONLY, lease, private_storage, register  # noqa: F401 (autouse fixture)


@pytest.fixture
def fleet_settings(settings):
    settings.AGENT_LONG_POLL_SECONDS = 20
    settings.AGENT_HEARTBEAT_SECONDS = 10
    settings.AGENT_OFFLINE_AFTER_SECONDS = 60
    settings.AGENT_LEASE_SECONDS = 120
    settings.AGENT_POLLS_PER_SECOND = 100
    return settings


def test_a_small_fleet_gets_the_configured_intervals(fleet_settings):
    for size in (0, 1, 1000):
        chosen = intervals.intervals_for(size)
        assert (chosen["long_poll_s"], chosen["heartbeat_interval_s"]) == (20, 10), size


def test_a_large_fleet_polls_less_often_but_stays_online_and_cancellable(fleet_settings):
    assert intervals.intervals_for(3000)["long_poll_s"] == 30 and intervals.intervals_for(3000)["heartbeat_interval_s"] == 30
    huge = intervals.intervals_for(100_000)
    # A long-poll ends before the agent would count as offline (and inside a load balancer's 60 s idle timeout).
    assert huge["long_poll_s"] == 45 < fleet_settings.AGENT_OFFLINE_AFTER_SECONDS
    # A running task's heartbeat still comes four times a lease.
    assert huge["heartbeat_interval_s"] == 30 == fleet_settings.AGENT_LEASE_SECONDS // 4
    fleet_settings.AGENT_POLLS_PER_SECOND = 10
    assert intervals.intervals_for(300)["long_poll_s"] == 30


@pytest.mark.django_db(transaction=True)
def test_agents_are_told_the_stretched_intervals_in_the_lease_answer(tenant, fleet_settings):
    fleet_settings.AGENT_LONG_POLL_SECONDS = 0  # the test's lease answers at once
    fleet_settings.AGENT_POLLS_PER_SECOND = 1
    first = register(tenant, "first", ORT_ONLY)
    for index in range(4):
        register(tenant, f"more-{index}", ORT_ONLY)
    intervals.clear()  # as FLEET_COUNT_SECONDS later: the process counts again
    answer = lease(first)
    assert answer.status_code == 204
    assert answer["Kiln-Long-Poll"] == "5" and answer["Kiln-Heartbeat-Interval"] == "10"
    assert first.post("/api/agent/v1/heartbeat", {}, format="json").json()["long_poll_s"] == 5
