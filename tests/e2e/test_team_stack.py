"""Kiln for a team, end to end: two jobs on one device take turns (a real worker, a real agent process), so the second
job's first result never waits for the first job's re-timing, and every figure of each report row is one measurement set."""
from __future__ import annotations

from datetime import datetime

import pytest

from tests.conftest import wait_until
from tests.e2e.test_pipeline_stack import Api

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

# Loose enough that INT8 stays within it, so each job has two finalists and is re-timed side by side.
TOLERANCE = {"metric": "top1_agreement", "max_drop": 0.05}


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_two_jobs_on_one_agent_take_turns_and_the_second_gets_a_result_before_the_first_is_re_timed(kiln_stack, model_files):
    tenant = kiln_stack.create_user("team", "a-long-password-1", "Team")
    api = Api(kiln_stack.url, tenant.token)
    version = api.upload("/api/v1/models/", model_files["model"], name="digits")["versions"][0]["id"]
    validation = api.upload("/api/v1/datasets/", model_files["validation"], kind="validation")["id"]
    body = {"model_version": version, "precisions": ["fp32", "int8-dynamic"], "validation_dataset": validation, "tolerance": TOLERANCE}
    first, second = api.post("/api/v1/jobs/", json=body)["id"], api.post("/api/v1/jobs/", json=body)["id"]
    # Both built and waiting for a device before there is one: the device then sees both jobs' work at once.
    wait_until(lambda: all(api.get(f"/api/v1/jobs/{job}/").json()["status"] == "waiting_for_devices" for job in (first, second)),
               timeout=300, message="both jobs to wait for devices")
    kiln_stack.start_agent(tenant, "local", backends="onnxruntime")
    finished = [api.wait_for_job(job, kiln_stack, timeout=600) for job in (first, second)]
    for job in finished:
        assert job["status"] == "succeeded", (job["error"], [event["message"] for event in job["events"]])

    tasks = [task | {"job": job["id"]} for job in finished for task in job["device_tasks"]]
    measured = sorted((task for task in tasks if task["purpose"] == "measure"), key=lambda task: at(task["started_at"]))
    # In turn, not first come, first served (which would be [a, a, b, b]): whichever job the device served first, the
    # other's task comes next, every time.
    order = [task["job"] for task in measured]
    assert sorted(order) == sorted([first, first, second, second]) and all(a != b for a, b in zip(order, order[1:])), order
    leader, other = order[0], order[1]
    retimes = [task for task in tasks if task["job"] == leader and task["purpose"] == "retime"]
    assert len(retimes) == 1, "\n".join(event["message"] for job in finished for event in job["events"])
    [retime_of_leader] = retimes
    other_first_result = min(at(task["finished_at"]) for task in measured if task["job"] == other)
    assert other_first_result < at(retime_of_leader["finished_at"])
    # Each finished job's report agrees with itself (tests/agreement.py, run by kiln_stack for every finished job).
    for job in (first, second):
        assert api.get(f"/api/v1/jobs/{job}/").json()["waiting"] is None
