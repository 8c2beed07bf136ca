"""The agent protocol: enrolment, capability matching, leases, stale attempts, cancellation."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from devices.bench import INTERLEAVED_WINDOW
from kiln.fleet.models import Agent, RegistrationToken
from kiln.pipeline.models import DeploymentJob, DeviceTask, DeviceTaskStatus, JobEvent, JobStatus
from tests.conftest import make_tenant, upload
from workers.tasks import redispatch_waiting, requeue_expired_leases

# Transactional: the lease long-poll reads the database from executor threads, as it does in
# production, so they must see committed rows.
pytestmark = pytest.mark.django_db(transaction=True)

ORT_ONLY = {"runtimes": {"onnxruntime": "1.32"}, "cores": 2}
ORT_AND_OV = {"runtimes": {"onnxruntime": "1.32", "openvino": "2026.4"}, "cores": 2}


@pytest.fixture(autouse=True)
def private_storage(settings, tmp_path):
    settings.BLOB_ROOT = tmp_path / "blobs"
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.AGENT_LONG_POLL_SECONDS = 0


def registration_token(tenant) -> str:
    response = tenant.client.post("/api/v1/agents/registration-tokens/", {"name": "lab"}, format="json")
    assert response.status_code == 201
    body = response.json()
    assert body["token"] in body["register_command"]
    return body["token"]


def register(tenant, name: str, capabilities: dict, labels: dict | None = None, *, secret: str | None = None,
             housekeeping: bool = True) -> APIClient:
    """A registered agent's client; then, with `housekeeping`, the beat's re-dispatch of waiting jobs (as within
    KILN_HOUSEKEEPING_SECONDS in production: a registration itself dispatches nothing)."""
    response = APIClient().post(
        "/api/agent/v1/register",
        {"registration_token": secret or registration_token(tenant), "name": name, "labels": labels or {}, "capabilities": capabilities},
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["agent_token"].startswith("kiln_agt_") and body["heartbeat_interval_s"] > 0
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {body['agent_token']}")
    client.agent_id = body["agent_id"]
    if housekeeping:
        redispatch_waiting.apply()
    return client


def create_job(tenant, model_files, **body) -> int:
    version = upload(tenant.client, "/api/v1/models/", model_files["model"]).json()["versions"][0]["id"]
    return tenant.client.post("/api/v1/jobs/", {"model_version": version, **body}, format="json").json()["id"]


@pytest.fixture
def waiting_job(tenant, model_files):
    """A job whose host stages are done: fp32 and int8-dynamic variants wait for devices."""
    return create_job(tenant, model_files, precisions=["fp32", "int8-dynamic"])


@pytest.fixture
def pool_job(tenant, model_files):
    """A job targeted at the label pool=a, so that any agent of the pool may take its tasks."""
    return create_job(tenant, model_files, precisions=["fp32"], targets=["pool=a"])


def lease(client, wait_s=0):
    return client.post("/api/agent/v1/tasks/lease", {"wait_s": wait_s}, format="json")


def test_bad_registration_token_is_401():
    response = APIClient().post("/api/agent/v1/register", {"registration_token": "kiln_reg_nope", "name": "x"}, format="json")
    assert response.status_code == 401


def test_revoked_registration_token_cannot_enrol(tenant):
    secret = registration_token(tenant)
    token_id = tenant.client.get("/api/v1/agents/registration-tokens/").json()[0]["id"]
    tenant.client.post(f"/api/v1/agents/registration-tokens/{token_id}/revoke/")
    response = APIClient().post("/api/agent/v1/register", {"registration_token": secret, "name": "x"}, format="json")
    assert response.status_code == 401


def test_revoking_a_registration_token_again_keeps_the_first_revocation_time(tenant):
    registration_token(tenant)
    token_id = tenant.client.get("/api/v1/agents/registration-tokens/").json()[0]["id"]
    assert tenant.client.post(f"/api/v1/agents/registration-tokens/{token_id}/revoke/").status_code == 200
    revoked_at = RegistrationToken.objects.get(pk=token_id).revoked_at
    assert revoked_at is not None
    assert tenant.client.post(f"/api/v1/agents/registration-tokens/{token_id}/revoke/").status_code == 200
    assert RegistrationToken.objects.get(pk=token_id).revoked_at == revoked_at


def test_agent_token_is_hashed_at_rest(tenant):
    agent_client = register(tenant, "box", ORT_ONLY)
    secret = agent_client._credentials["HTTP_AUTHORIZATION"].split()[1]
    agent = Agent.objects.get(pk=agent_client.agent_id)
    assert secret not in (agent.digest, agent.lookup_prefix)


def test_tasks_go_only_to_agents_with_the_backend(tenant, model_files):
    ort_only = register(tenant, "ort-only", ORT_ONLY)
    both = register(tenant, "both", ORT_AND_OV)
    job_id = create_job(tenant, model_files, precisions=["fp32", "int8-dynamic"])
    leased = []
    for client in (ort_only, both):
        while (response := lease(client)).status_code == 200:
            task = response.json()
            leased.append((client.agent_id, task["backend"]))
            assert task["files"]["model"]["sha256"] and task["files"]["reference"]["url"]
            client.post(f"/api/agent/v1/tasks/{task['id']}/result", {"attempt": task["attempt"], "status": "failed", "error": "test"}, format="json")
    openvino_agents = {agent for agent, backend in leased if backend == "openvino"}
    assert openvino_agents == {both.agent_id}
    assert (ort_only.agent_id, "onnxruntime") in leased
    assert DeviceTask.objects.filter(job_id=job_id).count() == 2 + 4


def test_a_registration_writes_one_row_and_the_housekeeping_dispatches_the_waiting_job(tenant, waiting_job, django_capture_on_commit_callbacks):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    assert DeploymentJob.objects.get(pk=waiting_job).status == JobStatus.WAITING_FOR_DEVICES
    secret = registration_token(tenant)
    with CaptureQueriesContext(connection) as queries, django_capture_on_commit_callbacks() as sent:
        agent = register(tenant, "late", ORT_ONLY, secret=secret, housekeeping=False)
    writes = [query["sql"] for query in queries if not query["sql"].lstrip().upper().startswith("SELECT")]
    assert len(writes) == 1 and writes[0].startswith('INSERT INTO "fleet_agent"'), writes
    assert sent == []  # no message to the workers, nothing after a commit
    assert DeploymentJob.objects.get(pk=waiting_job).status == JobStatus.WAITING_FOR_DEVICES
    # The beat's housekeeping (every KILN_HOUSEKEEPING_SECONDS) sees the new agent and dispatches.
    assert redispatch_waiting.apply().get() == 1
    assert DeploymentJob.objects.get(pk=waiting_job).status == JobStatus.RUNNING
    assert lease(agent).status_code == 200
    # The job's log names the device the user registered, not an internal key such as "agent:7".
    dispatched = JobEvent.objects.filter(job_id=waiting_job, message__startswith="Dispatched").values_list("message", flat=True)
    assert [message.endswith("to late.") for message in dispatched] == [True], list(dispatched)


def test_a_label_pool_is_named_by_its_labels_in_the_job_log(tenant, pool_job):
    register(tenant, "first", ORT_ONLY, labels={"pool": "a"})
    dispatched = JobEvent.objects.filter(job_id=pool_job, message__startswith="Dispatched").values_list("message", flat=True)
    assert list(dispatched) == ["Dispatched 1 device task(s) to devices labelled pool=a."]


@pytest.mark.parametrize("call", ["heartbeat", "long-poll"])
def test_an_agent_back_from_offline_is_online_at_once_and_its_waiting_jobs_restart(tenant, model_files, call):
    from kiln.fleet.services import agents_mark_offline

    agent = register(tenant, "sleepy", ORT_ONLY)
    Agent.objects.filter(pk=agent.agent_id).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    assert agents_mark_offline() == 1 and agents_mark_offline() == 0
    job_id = create_job(tenant, model_files, precisions=["fp32"])
    assert DeploymentJob.objects.get(pk=job_id).status == JobStatus.WAITING_FOR_DEVICES
    # An idle agent sends no heartbeat: its long-poll is one, and brings it back as well.
    answer = agent.post("/api/agent/v1/heartbeat", {}, format="json") if call == "heartbeat" else lease(agent)
    assert answer.status_code in (200, 204)
    assert Agent.objects.get(pk=agent.agent_id).offline_since is None
    redispatch_waiting.apply()
    assert DeploymentJob.objects.get(pk=job_id).status == JobStatus.RUNNING
    assert lease(agent).status_code == 200


def test_agents_racing_for_a_task_claim_it_by_compare_and_set_and_the_loser_takes_the_next(tenant, pool_job, model_files, monkeypatch):
    from kiln.fleet import selectors, services

    other_job = create_job(tenant, model_files, precisions=["fp32"], targets=["pool=a"])
    first = register(tenant, "first", ORT_ONLY, labels={"pool": "a"})
    second = register(tenant, "second", ORT_ONLY, labels={"pool": "a"})
    agents = {agent.pk: agent for agent in Agent.objects.filter(pk__in=[first.agent_id, second.agent_id])}
    # Both read the queue before either claims (a plain read, no lock): they see the same two tasks.
    seen = selectors.lease_candidates(agent=agents[first.agent_id])
    assert sorted(task.job_id for task in seen) == [pool_job, other_job]
    monkeypatch.setattr(services, "lease_candidates", lambda agent: list(seen))
    won = services.device_task_lease_once(agent=agents[first.agent_id])
    lost_then_next = services.device_task_lease_once(agent=agents[second.agent_id])
    assert (won.pk, lost_then_next.pk) == (seen[0].pk, seen[1].pk)
    assert {(task.leased_by_id, task.attempt) for task in DeviceTask.objects.all()} == {(first.agent_id, 1), (second.agent_id, 1)}
    assert services.device_task_lease_once(agent=agents[first.agent_id]) is None


def test_a_lease_look_reads_without_writing_until_there_is_something_to_claim(tenant, pool_job):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from kiln.fleet import services
    from kiln.fleet.selectors import agent_from_secret

    taker = register(tenant, "taker", ORT_ONLY, labels={"pool": "a"})  # the pool's task is dispatched
    elsewhere = register(tenant, "elsewhere", ORT_ONLY, labels={"pool": "b"})

    def look(client) -> tuple[object, list[str]]:
        """What a long-poll's first look runs (in this thread, so that its queries are seen)."""
        agent = agent_from_secret(secret=client._credentials["HTTP_AUTHORIZATION"].split()[1])
        with CaptureQueriesContext(connection) as queries:
            services.device_task_lease_begin(agent=agent)
            task = services.device_task_lease_once(agent=agent)
        return task, [q["sql"] for q in queries if not q["sql"].lstrip().upper().startswith("SELECT")]

    # A task is queued, but not one this agent may run: reads only.
    task, writes = look(elsewhere)
    assert task is None and writes == []
    task, writes = look(taker)
    assert task is not None and len(writes) == 1 and writes[0].startswith('UPDATE "pipeline_devicetask"'), writes


def test_lease_answers_carry_the_intervals_an_idle_agent_needs(tenant, waiting_job):
    agent = register(tenant, "box", ORT_ONLY)
    answers = []
    while not answers or answers[-1].status_code == 200:
        answers.append(lease(agent))
        if answers[-1].status_code == 200:
            agent.post(f"/api/agent/v1/tasks/{answers[-1].json()['id']}/result", {"attempt": 1, "status": "failed", "error": "x"}, format="json")
    assert [answer.status_code for answer in answers] == [200, 200, 204]
    chosen = agent.post("/api/agent/v1/heartbeat", {}, format="json").json()
    for answer in answers:
        announced = (int(answer["Kiln-Long-Poll"]), int(answer["Kiln-Heartbeat-Interval"]), int(answer["Kiln-Poll-Interval"]))
        assert announced == (chosen["long_poll_s"], chosen["heartbeat_interval_s"], chosen["poll_interval_s"]) and min(announced) >= 1


def test_a_device_that_goes_offline_before_re_timing_its_finalists_does_not_hold_the_job(tenant, waiting_job, django_capture_on_commit_callbacks):
    from kiln.fleet.services import agents_mark_offline
    from kiln.pipeline.models import DeviceTaskPurpose

    agent = register(tenant, "leaving", ORT_ONLY)
    for _ in range(2):  # the job's two measure tasks; the re-timing task then waits, pinned to this agent
        task = lease(agent).json()
        result = {"attempt": task["attempt"], "status": "succeeded", "accuracy": {"cosine": 1.0, "top1_agreement": 1.0},
                  "metrics": {"latency_ms": {"p50": 2.0 if task["variant"]["key"] == "fp32" else 1.0, "cv": 0.01, "count": 50}}}
        with django_capture_on_commit_callbacks(execute=True):
            assert agent.post(f"/api/agent/v1/tasks/{task['id']}/result", result, format="json").status_code == 200
    retime = DeviceTask.objects.get(job_id=waiting_job, purpose=DeviceTaskPurpose.RETIME)
    assert retime.status == DeviceTaskStatus.QUEUED and retime.pinned_agent_id == agent.agent_id
    from kiln.fleet import heartbeats

    heartbeats.clear()  # this process noted the agent's last call in memory; it has been silent since
    Agent.objects.filter(pk=agent.agent_id).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert agents_mark_offline() == 1
    retime.refresh_from_db()
    assert retime.status == DeviceTaskStatus.CANCELED
    job = DeploymentJob.objects.get(pk=waiting_job)
    assert job.status == JobStatus.SUCCEEDED, [event.message for event in job.events.all()]
    assert job.events.filter(message__startswith="The finalists were not re-timed side by side: its device went offline").exists()


def test_stale_attempt_is_refused_and_changes_nothing(tenant, pool_job, settings):
    first = register(tenant, "first", ORT_ONLY, labels={"pool": "a"})
    task = lease(first).json()
    DeviceTask.objects.filter(pk=task["id"]).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert requeue_expired_leases.apply().get() == 1
    assert requeue_expired_leases.apply().get() == 0
    second = register(tenant, "second", ORT_ONLY, labels={"pool": "a"})
    retaken = lease(second).json()
    assert retaken["id"] == task["id"] and retaken["attempt"] == task["attempt"] + 1
    stale = first.post(f"/api/agent/v1/tasks/{task['id']}/result", {"attempt": task["attempt"], "status": "succeeded", "metrics": {"latency_ms": {"p50": 1}}}, format="json")
    assert stale.status_code == 409
    row = DeviceTask.objects.get(pk=task["id"])
    assert row.status == DeviceTaskStatus.LEASED and row.metrics == {}
    ok = second.post(f"/api/agent/v1/tasks/{task['id']}/result", {"attempt": retaken["attempt"], "status": "succeeded", "metrics": {"latency_ms": {"p50": 1}}}, format="json")
    assert ok.status_code == 200
    again = second.post(f"/api/agent/v1/tasks/{task['id']}/result", {"attempt": retaken["attempt"], "status": "succeeded"}, format="json")
    assert again.status_code == 409


def test_a_heartbeat_naming_the_task_it_runs_keeps_its_lease_through_a_long_stage(tenant, pool_job, settings):
    """A stage may run past a lease with no progress report (a TensorRT build, the first import on a slow or emulated
    device): the heartbeat of the agent running the task keeps it; one naming a task it does not hold keeps nothing."""
    first = register(tenant, "first", ORT_ONLY, labels={"pool": "a"})
    task = lease(first).json()
    almost = timezone.now() + timedelta(seconds=1)
    DeviceTask.objects.filter(pk=task["id"]).update(lease_expires_at=almost)
    answer = first.post("/api/agent/v1/heartbeat", {"running_task": task["id"]}, format="json").json()
    assert answer["cancel"] == []
    expires = DeviceTask.objects.get(pk=task["id"]).lease_expires_at
    assert expires >= almost + timedelta(seconds=settings.AGENT_LEASE_SECONDS - 5)

    # Silent past KILN_AGENT_SILENT_STAGE_SECONDS since its last progress report: the stage is taken as hung.
    DeviceTask.objects.filter(pk=task["id"]).update(lease_expires_at=almost,
                                                    reported_at=timezone.now() - timedelta(seconds=settings.AGENT_SILENT_STAGE_SECONDS + 1))
    assert first.post("/api/agent/v1/heartbeat", {"running_task": task["id"]}, format="json").json()["cancel"] == []
    assert DeviceTask.objects.get(pk=task["id"]).lease_expires_at == almost
    # A progress report counts from now again.
    first.post(f"/api/agent/v1/tasks/{task['id']}/progress", {"attempt": task["attempt"], "stage": "compile"}, format="json")
    DeviceTask.objects.filter(pk=task["id"]).update(lease_expires_at=almost)
    first.post("/api/agent/v1/heartbeat", {"running_task": task["id"]}, format="json")
    assert DeviceTask.objects.get(pk=task["id"]).lease_expires_at > almost

    other = register(tenant, "other", ORT_ONLY, labels={"pool": "a"})
    DeviceTask.objects.filter(pk=task["id"]).update(lease_expires_at=almost)
    assert task["id"] in other.post("/api/agent/v1/heartbeat", {"running_task": task["id"]}, format="json").json()["cancel"]
    assert DeviceTask.objects.get(pk=task["id"]).lease_expires_at == almost
    DeviceTask.objects.filter(pk=task["id"]).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert requeue_expired_leases.apply().get() == 1
    # Requeued, the first agent's heartbeat no longer extends anything: it is told to stop.
    assert task["id"] in first.post("/api/agent/v1/heartbeat", {"running_task": task["id"]}, format="json").json()["cancel"]
    assert DeviceTask.objects.get(pk=task["id"]).lease_expires_at is None


def test_lease_expiry_gives_up_after_the_last_attempt(tenant, waiting_job, settings):
    settings.DEVICE_TASK_MAX_ATTEMPTS = 1
    agent = register(tenant, "flaky", ORT_ONLY)
    task = lease(agent).json()
    DeviceTask.objects.filter(pk=task["id"]).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    requeue_expired_leases.apply()
    row = DeviceTask.objects.get(pk=task["id"])
    assert row.status == DeviceTaskStatus.FAILED and "expired" in row.error


def test_malformed_unknown_and_foreign_task_calls_are_4xx(tenant, waiting_job):
    agent = register(tenant, "box", ORT_ONLY)
    task = lease(agent).json()
    malformed = agent.post(f"/api/agent/v1/tasks/{task['id']}/result", "{not json", content_type="application/json")
    assert malformed.status_code == 400
    assert agent.post("/api/agent/v1/tasks/99999999/progress", {"attempt": 1}, format="json").status_code == 404
    stranger = register(make_tenant(username="eve", organization="Evil"), "evil", ORT_ONLY)
    assert stranger.post(f"/api/agent/v1/tasks/{task['id']}/result", {"attempt": 1, "status": "succeeded"}, format="json").status_code == 404
    assert stranger.get(f"/api/agent/v1/tasks/{task['id']}/files/model").status_code == 404
    other = register(tenant, "not-holder", ORT_ONLY)
    assert other.post(f"/api/agent/v1/tasks/{task['id']}/result", {"attempt": 1, "status": "succeeded"}, format="json").status_code == 409
    assert DeviceTask.objects.get(pk=task["id"]).status == DeviceTaskStatus.LEASED


def test_only_the_lease_holder_downloads_task_files(tenant, waiting_job):
    agent = register(tenant, "box", ORT_ONLY)
    task = lease(agent).json()
    response = agent.get(task["files"]["model"]["url"])
    assert response.status_code == 200
    import hashlib

    assert hashlib.sha256(b"".join(response.streaming_content)).hexdigest() == task["files"]["model"]["sha256"]


def test_cancel_reaches_a_running_task_through_heartbeat_and_progress(tenant, waiting_job):
    agent = register(tenant, "box", ORT_ONLY)
    task = lease(agent).json()
    assert tenant.client.post(f"/api/v1/jobs/{waiting_job}/cancel/").status_code == 200
    heartbeat = agent.post("/api/agent/v1/heartbeat", {"running_task": task["id"]}, format="json").json()
    assert task["id"] in heartbeat["cancel"]
    progress = agent.post(f"/api/agent/v1/tasks/{task['id']}/progress", {"attempt": task["attempt"], "stage": "benchmark"}, format="json").json()
    assert progress["cancel"] is True
    assert lease(agent).status_code == 204


def test_revoked_agent_gets_401(tenant):
    agent = register(tenant, "box", ORT_ONLY)
    assert tenant.client.post(f"/api/v1/agents/{agent.agent_id}/revoke/").status_code == 200
    assert agent.post("/api/agent/v1/heartbeat", {}, format="json").status_code == 401


def test_results_complete_the_job_with_a_report(tenant, waiting_job, django_capture_on_commit_callbacks):
    agent = register(tenant, "box", ORT_ONLY)
    latencies = {"fp32": 2.0, "int8-dynamic": 1.0}
    with django_capture_on_commit_callbacks(execute=True):
        while (response := lease(agent)).status_code == 200:
            task = response.json()
            key = task["variant"]["key"]
            agent.post(f"/api/agent/v1/tasks/{task['id']}/progress", {"attempt": task["attempt"], "stage": "benchmark", "percent": 50}, format="json")
            result = {
                "attempt": task["attempt"], "status": "succeeded",
                "metrics": {"latency_ms": {"p50": latencies[key], "p90": latencies[key], "p99": latencies[key], "mean": latencies[key], "std": 0}},
                "accuracy": {"cosine": 1.0 if key == "fp32" else 0.999, "top1_agreement": 1.0 if key == "fp32" else 0.995, "accuracy": None},
            }
            assert agent.post(f"/api/agent/v1/tasks/{task['id']}/result", result, format="json").status_code == 200
    report = tenant.client.get(f"/api/v1/jobs/{waiting_job}/report/").json()
    assert report["status"] == "succeeded"
    device = report["devices"][0]
    assert device["agent"]["name"] == "box"
    recommended = next(v for v in device["variants"] if v["id"] == device["recommended"])
    assert recommended["precision"] == "int8-dynamic"
    assert recommended["accuracy"]["metric"] == "top1_agreement" and recommended["accuracy"]["within_tolerance"]
    assert "2.00x" in device["reason"]


def test_compiled_artifacts_of_every_task_are_listed_and_downloadable(tenant, waiting_job, tmp_path):
    both = register(tenant, "both", ORT_AND_OV)
    uploaded = []
    while (response := lease(both)).status_code == 200:
        task = response.json()
        compiled = tmp_path / f"compiled-{task['id']}.bin"
        compiled.write_bytes(f"engine for task {task['id']}".encode())
        with open(compiled, "rb") as handle:
            answer = both.post(f"/api/agent/v1/tasks/{task['id']}/artifact", {"attempt": task["attempt"], "file": handle}, format="multipart")
        assert answer.status_code == 201, answer.content
        uploaded.append(answer.json()["sha256"])
        both.post(f"/api/agent/v1/tasks/{task['id']}/result", {"attempt": task["attempt"], "status": "failed", "error": "test"}, format="json")
    artifacts = [a for a in tenant.client.get(f"/api/v1/jobs/{waiting_job}/artifacts/").json() if a["kind"] == "compiled"]
    assert sorted(a["sha256"] for a in artifacts) == sorted(uploaded) and len(uploaded) == 4
    assert {a["backend"] for a in artifacts} == {"onnxruntime", "openvino"}


def test_a_stopping_agent_hands_its_task_back_to_the_queue(tenant, pool_job):
    stopping = register(tenant, "stopping", ORT_ONLY, labels={"pool": "a"})
    task = lease(stopping).json()
    answer = stopping.post(f"/api/agent/v1/tasks/{task['id']}/result", {"attempt": task["attempt"], "status": "handed_back", "error": "agent stopping"}, format="json")
    assert answer.status_code == 200
    row = DeviceTask.objects.get(pk=task["id"])
    assert row.status == DeviceTaskStatus.QUEUED and row.leased_by is None and row.error == ""
    other = register(tenant, "other", ORT_ONLY, labels={"pool": "a"})
    again = lease(other).json()
    assert again["id"] == task["id"] and again["attempt"] == task["attempt"] + 1


def test_report_shows_results_so_far_while_the_job_runs(tenant, waiting_job):
    agent = register(tenant, "box", ORT_ONLY)
    task = lease(agent).json()
    result = {"attempt": task["attempt"], "status": "succeeded", "metrics": {"latency_ms": {"p50": 1.5}}, "accuracy": {"cosine": 1.0}}
    assert agent.post(f"/api/agent/v1/tasks/{task['id']}/result", result, format="json").status_code == 200
    report = tenant.client.get(f"/api/v1/jobs/{waiting_job}/report/").json()
    assert report["status"] == "running"
    device = report["devices"][0]
    assert device["final"] is False
    statuses = {v["id"]: v["status"] for v in device["variants"]}
    assert statuses[task["id"]] == "succeeded" and "queued" in statuses.values()
    assert device["recommended"] == task["id"]


def test_finished_job_offers_a_package_of_the_recommended_variant(tenant, waiting_job, tmp_path, django_capture_on_commit_callbacks):
    import hashlib
    import subprocess
    import sys
    import zipfile

    import numpy as np

    agent = register(tenant, "box", ORT_ONLY)
    with django_capture_on_commit_callbacks(execute=True):
        while (response := lease(agent)).status_code == 200:
            task = response.json()
            p50 = 1.0 if task["variant"]["key"] == "int8-dynamic" else 2.0
            result = {"attempt": task["attempt"], "status": "succeeded", "metrics": {"latency_ms": {"p50": p50, "p99": p50}}, "accuracy": {"cosine": 0.9999}}
            agent.post(f"/api/agent/v1/tasks/{task['id']}/result", result, format="json")
    report = tenant.client.get(f"/api/v1/jobs/{waiting_job}/report/").json()
    chosen = next(v for v in report["devices"][0]["variants"] if v["id"] == report["devices"][0]["recommended"])
    packages = [a for a in tenant.client.get(f"/api/v1/jobs/{waiting_job}/artifacts/").json() if a["kind"] == "package"]
    # The package names what the pick runs in, its effective precision (issue 33: a bf16 pick's package said fp32).
    assert len(packages) == 1 and packages[0]["precision"] == chosen["effective_precision"] == "int8"
    assert report["devices"][0]["package"]["download_url"] == packages[0]["download_url"]
    archive_path = tmp_path / packages[0]["name"]
    archive_path.write_bytes(b"".join(tenant.client.get(packages[0]["download_url"]).streaming_content))
    with zipfile.ZipFile(archive_path) as archive:
        assert {"model.onnx", "report.json", "run.py", "README.md"} <= set(archive.namelist())
        assert hashlib.sha256(archive.read("model.onnx")).hexdigest() == chosen["variant_artifact"]["sha256"]
        assert "int8-dynamic" in archive.read("README.md").decode()
        archive.extractall(tmp_path / "package")
    np.savez(tmp_path / "inputs.npz", input=np.random.default_rng(0).standard_normal((4, 1, 8, 8)).astype(np.float32))
    run = subprocess.run([sys.executable, "run.py", str(tmp_path / "inputs.npz"), "--runs", "3"], cwd=tmp_path / "package", capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("verified: ") and "\np50 " in run.stdout


def test_finalists_are_re_timed_by_the_agent_that_measured_them_and_the_report_pairs_the_rounds(
        tenant, waiting_job, django_capture_on_commit_callbacks, settings):
    from kiln.pipeline.models import DeviceTaskPurpose
    from kiln.pipeline.retime import job_retime_finalists

    agent = register(tenant, "box", ORT_ONLY)
    # int8-dynamic measured 3% faster than FP32 with a 10% spread: a near-tie the first pass cannot settle.
    latencies = {"fp32": 2.0, "int8-dynamic": 1.94}
    measured = {}
    while (response := lease(agent)).status_code == 200:
        task = response.json()
        if task["retime"]:
            break  # the job's next step once every measure task ended: its finalists, side by side
        p50 = latencies[task["variant"]["key"]]
        measured[task["variant"]["key"]] = task["id"]
        result = {"attempt": task["attempt"], "status": "succeeded", "accuracy": {"cosine": 1.0, "top1_agreement": 1.0},
                  "metrics": {"latency_ms": {"p50": p50, "cv": 0.1, "count": 50}}}
        assert agent.post(f"/api/agent/v1/tasks/{task['id']}/result", result, format="json").status_code == 200
    # Collect created the re-timing task once the last measure task ended: a job that named its precisions is re-timed too.
    job = DeploymentJob.objects.get(pk=waiting_job)
    assert job.status == JobStatus.RUNNING and job.stage == "devices"
    with django_capture_on_commit_callbacks(execute=True):
        assert job_retime_finalists(job=job) == 0  # once per device
    retime = DeviceTask.objects.get(job=job, purpose=DeviceTaskPurpose.RETIME)
    assert retime.pinned_agent_id == agent.agent_id

    assert task["id"] == retime.id and task["retime"]["rounds"] == settings.RETIME_MAX_ROUNDS and task["retime"]["min_rounds"] == 6
    # The agent times its windows as the host search's confirmation does: one definition of both.
    assert task["retime"]["window"] == INTERLEAVED_WINDOW
    rows = {row["task"]: row for row in task["retime"]["variants"]}
    assert set(rows) == set(measured.values())
    import hashlib

    for row in rows.values():
        body = agent.get(row["model"]["url"])
        assert body.status_code == 200 and hashlib.sha256(b"".join(body.streaming_content)).hexdigest() == row["model"]["sha256"]
    # Only the variants this task re-times can be fetched through it.
    assert agent.get(f"/api/agent/v1/tasks/{task['id']}/files/retime-999999").status_code == 404

    drift = [1.0, 1.5, 0.9, 1.3, 2.0, 1.1, 0.95, 1.7, 1.2]
    windows = {measured["fp32"]: [2.0 * d for d in drift], measured["int8-dynamic"]: [1.8 * d for d in drift]}
    result = {"attempt": task["attempt"], "status": "succeeded",
              "metrics": {"retime": [{"task": task_id, "interleaved_medians_ms": values} for task_id, values in windows.items()]}}
    assert agent.post(f"/api/agent/v1/tasks/{task['id']}/result", result, format="json").status_code == 200
    for task_id, values in windows.items():
        assert DeviceTask.objects.get(pk=task_id).metrics["interleaved_medians_ms"] == pytest.approx(values)

    report = tenant.client.get(f"/api/v1/jobs/{waiting_job}/report/").json()
    device = report["devices"][0]
    assert len(device["variants"]) == 2  # the re-timing task is not a variant of its own
    # Paired windows: 1.11x in every round, beyond noise although the rounds swing 2x.
    chosen = next(v for v in device["variants"] if v["id"] == device["recommended"])
    assert chosen["key"] == "int8-dynamic" and not device["decision"]["tie"]
    assert device["decision"]["speedup"]["source"] == "interleaved re-timing" and device["decision"]["speedup"]["low"] > 1.0
    assert device["decision"]["measurement"]["rounds"] == 9


def test_a_re_timing_result_that_is_unpaired_or_names_other_tasks_changes_nothing(tenant, waiting_job):
    from kiln.pipeline.models import DeviceTaskPurpose
    from kiln.pipeline.retime import retime_results_store

    agent = register(tenant, "box", ORT_ONLY)
    ids = []
    while (response := lease(agent)).status_code == 200:
        task = response.json()
        ids.append(task["id"])
        agent.post(f"/api/agent/v1/tasks/{task['id']}/result", {"attempt": task["attempt"], "status": "succeeded",
                                                                 "metrics": {"latency_ms": {"p50": 1.0}}}, format="json")
    first = DeviceTask.objects.get(pk=ids[0])
    retime = DeviceTask.objects.create(organization=first.organization, job=first.job, variant=first.variant, backend=first.backend,
                                       target=first.target, purpose=DeviceTaskPurpose.RETIME, retime={"tasks": ids})
    unpaired = {"retime": [{"task": ids[0], "interleaved_medians_ms": [1.0, 1.1, 1.2]}, {"task": ids[1], "interleaved_medians_ms": [1.0, 1.1]}]}
    foreign = {"retime": [{"task": ids[0], "interleaved_medians_ms": [1.0, 1.1]}, {"task": 10**9, "interleaved_medians_ms": [1.0, 1.1]}]}
    assert retime_results_store(task=retime, metrics=unpaired) == 0
    assert retime_results_store(task=retime, metrics=foreign) == 0
    assert not any("interleaved_medians_ms" in DeviceTask.objects.get(pk=task_id).metrics for task_id in ids)


def test_a_revoked_token_is_refused_at_once_though_this_process_cached_it(tenant, settings):
    settings.AGENT_AUTH_CACHE_SECONDS = 3600
    agent = register(tenant, "box", ORT_ONLY)
    assert agent.post("/api/agent/v1/heartbeat", {}, format="json").status_code == 200
    assert agent.post("/api/agent/v1/tasks/lease", {"wait_s": 0}, format="json").status_code == 204
    assert tenant.client.post(f"/api/v1/agents/{agent.agent_id}/revoke/").status_code == 200
    assert agent.post("/api/agent/v1/heartbeat", {}, format="json").status_code == 401
    assert agent.post("/api/agent/v1/tasks/lease", {"wait_s": 0}, format="json").status_code == 401
    assert agent.post("/api/agent/v1/tasks/1/progress", {"attempt": 1}, format="json").status_code == 401


def test_a_cached_token_spares_the_lookup_and_stays_per_token(tenant, settings, django_assert_max_num_queries):
    from kiln.fleet.selectors import agent_from_secret

    settings.AGENT_AUTH_CACHE_SECONDS = 3600
    first, second = register(tenant, "first", ORT_ONLY), register(tenant, "second", ORT_ONLY)
    first_secret = first._credentials["HTTP_AUTHORIZATION"].split()[1]
    assert agent_from_secret(secret=first_secret).pk == first.agent_id
    with django_assert_max_num_queries(0):
        assert agent_from_secret(secret=first_secret).pk == first.agent_id
    assert agent_from_secret(secret=first_secret[:-2] + "xx") is None
    assert agent_from_secret(secret=second._credentials["HTTP_AUTHORIZATION"].split()[1]).pk == second.agent_id


def test_an_agent_serves_jobs_in_turn_and_a_waiting_job_says_whose_task_runs(tenant, model_files):
    agent = register(tenant, "box", ORT_ONLY)
    first = create_job(tenant, model_files, precisions=["fp32", "int8-dynamic"])
    second = create_job(tenant, model_files, precisions=["fp32", "int8-dynamic"])
    served = []
    while (response := lease(agent)).status_code == 200:
        task = response.json()
        served.append(task["job"])
        if len(served) == 1:
            said = tenant.client.get(f"/api/v1/jobs/{second}/").json()["waiting"]
            assert said["cause"] == "device_busy" and said["position"] == 1, said
            assert said["message"] == f"device box busy with job {first}: 1 task ahead (2 of this job's queued)"
        agent.post(f"/api/agent/v1/tasks/{task['id']}/result", {"attempt": task["attempt"], "status": "failed", "error": "test"}, format="json")
    # First come, first served would have been [first, first, second, second].
    assert served == [first, second, first, second]


def _held(task_id: int, *, from_s: float, to_s: float, now) -> None:
    """A task that held the device from `from_s` to `to_s` seconds before `now`."""
    DeviceTask.objects.filter(pk=task_id).update(status=DeviceTaskStatus.SUCCEEDED, started_at=now - timedelta(seconds=from_s),
                                                 finished_at=now - timedelta(seconds=to_s))


def _one_more_task(job_id: int) -> int:
    """Another queued measurement of the job's first variant (its own target name: one task per cell)."""
    task = DeviceTask.objects.filter(job_id=job_id).first()
    count = DeviceTask.objects.filter(job_id=job_id).count()
    return DeviceTask.objects.create(job_id=job_id, organization_id=task.organization_id, variant=task.variant, backend=task.backend,
                                     target=f"{task.target}/{count}", pinned_agent_id=task.pinned_agent_id).pk


def test_the_device_shares_its_time_a_job_of_short_measurements_goes_before_one_that_held_it_long(tenant, model_files):
    agent = register(tenant, "box", ORT_ONLY)
    long, short = (create_job(tenant, model_files, precisions=["fp32", "int8-dynamic"]) for _ in range(2))
    now = timezone.now()
    DeviceTask.objects.filter(job_id__in=[long, short]).update(created_at=now - timedelta(seconds=90))
    # Both queued 90 s ago; since then the long job held the device 50 s, the short one 2 s, and the long job's last turn
    # began first: turns by last start alone would serve the long job now.
    _held(DeviceTask.objects.filter(job_id=long).first().pk, from_s=80, to_s=30, now=now)
    _held(DeviceTask.objects.filter(job_id=short).first().pk, from_s=30, to_s=28, now=now)
    assert lease(agent).json()["job"] == short
    # While the short job's task runs, the long job's waits one task: the one running.
    said = tenant.client.get(f"/api/v1/jobs/{long}/").json()["waiting"]
    assert said["cause"] == "device_busy" and said["position"] == 1, said


def test_a_job_that_comes_later_does_not_make_up_for_device_time_before_it_came(tenant, model_files):
    agent = register(tenant, "box", ORT_ONLY)
    old, new = (create_job(tenant, model_files, precisions=["fp32"]) for _ in range(2))
    now = timezone.now()
    extra = _one_more_task(old)
    DeviceTask.objects.filter(job_id=old).update(created_at=now - timedelta(seconds=200))
    DeviceTask.objects.filter(job_id=new).update(created_at=now - timedelta(seconds=100))
    _held(DeviceTask.objects.filter(job_id=old).exclude(pk=extra).first().pk, from_s=180, to_s=120, now=now)  # before `new` came
    _one_more_task(new)
    _held(DeviceTask.objects.filter(job_id=new).order_by("id").first().pk, from_s=90, to_s=70, now=now)  # 20 s since
    _held(extra, from_s=60, to_s=57, now=now)  # 3 s since
    _one_more_task(old)
    # Since `new` came, `old` held the device 3 s and `new` 20 s: `old` goes first, though it had more in all and its last
    # turn was later.
    assert lease(agent).json()["job"] == old


def test_a_re_timing_that_waits_for_quiet_waits_briefly_while_another_jobs_task_waits_for_the_device(tenant, model_files):
    from kiln.pipeline.models import DeviceTaskPurpose
    from kiln.pipeline.retime import SHARED_QUIET_WAIT_S, quiet_wait_s

    agent = register(tenant, "box", ORT_ONLY)
    first = create_job(tenant, model_files, precisions=["fp32", "int8-dynamic"])
    measured = DeviceTask.objects.filter(job_id=first).first()
    retime = DeviceTask.objects.create(job_id=first, organization=tenant.organization, variant=measured.variant, backend="onnxruntime",
                                       target=measured.target, pinned_agent_id=agent.agent_id, purpose=DeviceTaskPurpose.RETIME,
                                       retime={"tasks": [measured.id], "wait_for_quiet_s": 300})
    DeviceTask.objects.filter(job_id=first).exclude(pk=retime.pk).update(status=DeviceTaskStatus.SUCCEEDED)
    assert quiet_wait_s(retime) == 300  # nobody else waits for the device: wait out the outside load
    create_job(tenant, model_files, precisions=["fp32"])
    assert quiet_wait_s(retime) == SHARED_QUIET_WAIT_S  # another job's measurement waits: the re-timing does not hold it long


def test_a_re_timing_holds_the_device_for_bounded_seconds_only_while_another_jobs_task_waits(tenant, model_files, settings):
    from kiln.pipeline.models import DeviceTaskPurpose
    from kiln.pipeline.retime import rounds_seconds

    settings.RETIME_SHARED_SECONDS = 17
    agent = register(tenant, "box", ORT_ONLY)
    first = create_job(tenant, model_files, precisions=["fp32", "int8-dynamic"])
    measured = list(DeviceTask.objects.filter(job_id=first))
    DeviceTask.objects.filter(job_id=first).update(status=DeviceTaskStatus.SUCCEEDED, leased_by_id=agent.agent_id)
    retime = DeviceTask.objects.create(job_id=first, organization=tenant.organization, variant=measured[0].variant, backend="onnxruntime",
                                       target=measured[0].target, pinned_agent_id=agent.agent_id, purpose=DeviceTaskPurpose.RETIME,
                                       retime={"tasks": [task.id for task in measured], "rounds": 30, "min_rounds": 6})
    assert rounds_seconds(retime) is None  # nobody else waits for the device: only the round cap
    second = create_job(tenant, model_files, precisions=["fp32"])
    assert rounds_seconds(retime) == 17  # another job's measurement waits: the rounds hold the device 17 s at most
    # The agent learns it at every round's progress report, not only at the lease.
    DeviceTask.objects.filter(pk=retime.pk).update(status=DeviceTaskStatus.LEASED, leased_by_id=agent.agent_id, attempt=1)
    progress = f"/api/agent/v1/tasks/{retime.pk}/progress"
    assert agent.post(progress, {"attempt": 1, "stage": "benchmark", "message": "round 7"}, format="json").json()["max_seconds"] == 17
    DeviceTask.objects.filter(job_id=second).update(status=DeviceTaskStatus.SUCCEEDED)
    assert rounds_seconds(retime) is None
    assert agent.post(progress, {"attempt": 1, "stage": "benchmark", "message": "round 8"}, format="json").json()["max_seconds"] is None


def test_an_auto_searchs_re_timing_holds_the_device_no_longer_than_its_budget_has_left(tenant, model_files, settings):
    from kiln.pipeline.models import DeploymentJob, DeviceTaskPurpose
    from kiln.pipeline.retime import rounds_seconds

    settings.RETIME_SHARED_SECONDS = 17
    agent = register(tenant, "box", ORT_ONLY)
    first = create_job(tenant, model_files, precisions=["fp32", "int8-dynamic"])
    measured = list(DeviceTask.objects.filter(job_id=first))
    DeviceTask.objects.filter(job_id=first).update(status=DeviceTaskStatus.SUCCEEDED, leased_by_id=agent.agent_id)
    # The search has had 540 s of its 10 minutes of work: its re-timing may hold the device 60 s past its minimum rounds.
    DeploymentJob.objects.filter(pk=first).update(precisions=["auto"], search={"budget_minutes": 10}, work_seconds=540.0)
    retime = DeviceTask.objects.create(job_id=first, organization=tenant.organization, variant=measured[0].variant, backend="onnxruntime",
                                       target=measured[0].target, pinned_agent_id=agent.agent_id, purpose=DeviceTaskPurpose.RETIME,
                                       retime={"tasks": [task.id for task in measured], "rounds": 30, "min_rounds": 6})
    assert rounds_seconds(retime) == 60
    create_job(tenant, model_files, precisions=["fp32"])
    assert rounds_seconds(DeviceTask.objects.get(pk=retime.pk)) == 17  # another job waits: the shorter of the two
    DeploymentJob.objects.filter(pk=first).update(work_seconds=700.0)
    assert rounds_seconds(DeviceTask.objects.get(pk=retime.pk)) == 0  # spent: the minimum rounds only


