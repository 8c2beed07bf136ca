"""End to end with real processes: live server, a Celery worker process, kiln-agent processes."""
from __future__ import annotations

import io
import os
import signal

import numpy as np
import onnxruntime as ort
import pytest
import requests

from kiln.pipeline.models import DeviceTask, DeviceTaskStatus
from tests.conftest import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


class Api:
    """A script's view of the REST API: bearer token, JSON errors raised with their message."""

    def __init__(self, url: str, token: str):
        self.url = url
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def get(self, path: str, **kwargs):
        response = self.session.get(self.url + path, timeout=30, **kwargs)
        assert response.status_code == 200, f"GET {path}: {response.status_code} {response.text[:500]}"
        return response

    def post(self, path: str, expect: int = 201, **kwargs):
        response = self.session.post(self.url + path, timeout=60, **kwargs)
        assert response.status_code == expect, f"POST {path}: {response.status_code} {response.text[:500]}"
        return response.json() if response.content else None

    def upload(self, path: str, file_path, **fields):
        with open(file_path, "rb") as handle:
            return self.post(path, data=fields, files={"file": (file_path.name, handle)})

    def wait_for_job(self, job_id: int, stack, statuses=("succeeded", "failed", "canceled"), timeout=180) -> dict:
        def finished():
            try:
                job = self.get(f"/api/v1/jobs/{job_id}/").json()
            except requests.ConnectionError:  # behind a balancer, a poll in flight to a host that just died: poll again
                return None
            return job if job["status"] in statuses else None

        try:
            return wait_until(finished, timeout=timeout, message=f"job {job_id} to reach {statuses}")
        except AssertionError:
            print(self.get(f"/api/v1/jobs/{job_id}/").json())
            print(stack.logs())
            raise


@pytest.fixture
def api_for(kiln_stack):
    def make(username: str, organization: str) -> tuple[Api, object]:
        tenant = kiln_stack.create_user(username, "a-long-password-1", organization)
        return Api(kiln_stack.url, tenant.token), tenant

    return make


def upload_digits(api: Api, model_files) -> dict:
    model = api.upload("/api/v1/models/", model_files["model"], name="digits")
    calibration = api.upload("/api/v1/datasets/", model_files["calibration"], name="calib", kind="calibration")
    validation = api.upload("/api/v1/datasets/", model_files["validation"], name="val", kind="validation")
    return {"version": model["versions"][0]["id"], "calibration": calibration["id"], "validation": validation["id"]}


def test_celery_worker_builds_host_artifacts_and_int8_stays_close(kiln_stack, api_for, model_files, digits):
    api, _ = api_for("alice", "Acme")
    ids = upload_digits(api, model_files)
    job = api.post("/api/v1/jobs/", json={"model_version": ids["version"], "precisions": ["fp32", "int8", "int8-dynamic"],
                                          "calibration_dataset": ids["calibration"], "validation_dataset": ids["validation"]})
    job = api.wait_for_job(job["id"], kiln_stack, statuses=("waiting_for_devices", "failed"))
    assert job["status"] == "waiting_for_devices", job["events"]
    artifacts = {a["name"]: a for a in api.get(f"/api/v1/jobs/{job['id']}/artifacts/").json()}
    assert {"converted.onnx", "reference-outputs.npz", "fp32.onnx", "int8.onnx", "int8-dynamic.onnx"} <= set(artifacts)
    int8_bytes = api.get(artifacts["int8.onnx"]["download_url"]).content
    session = ort.InferenceSession(int8_bytes, providers=["CPUExecutionProvider"])
    reference = np.load(io.BytesIO(api.get(artifacts["reference-outputs.npz"]["download_url"]).content))["logits"]
    quantized = session.run(None, {"input": digits.x_val})[0]
    agreement = float((quantized.argmax(1) == reference.argmax(1)).mean())
    assert agreement >= 0.98, agreement


def test_two_agents_run_a_job_and_openvino_goes_only_where_it_is_installed(kiln_stack, api_for, model_files):
    api, tenant = api_for("bob", "Bobs")
    ids = upload_digits(api, model_files)
    with_openvino = kiln_stack.start_agent(tenant, "with-ov", labels={"pool": "lab"}, backends="onnxruntime,openvino")
    without_openvino = kiln_stack.start_agent(tenant, "ort-only", labels={"pool": "lab"}, backends="onnxruntime")
    wait_until(lambda: sum(a["online"] for a in api.get("/api/v1/agents/").json()) == 2, timeout=30, message="two agents online")
    job = api.post("/api/v1/jobs/", json={"model_version": ids["version"], "precisions": ["fp32", "int8"], "targets": ["pool=lab"],
                                          "calibration_dataset": ids["calibration"], "validation_dataset": ids["validation"],
                                          "tolerance": {"metric": "accuracy", "max_drop": 0.02}})
    job = api.wait_for_job(job["id"], kiln_stack)
    assert job["status"] == "succeeded", (job["error"], job["events"], kiln_stack.logs())
    agents = {a["name"]: a["id"] for a in api.get("/api/v1/agents/").json()}
    openvino_tasks = [t for t in job["device_tasks"] if t["backend"] == "openvino"]
    assert openvino_tasks and all(t["agent"]["id"] == agents["with-ov"] for t in openvino_tasks)
    report = api.get(f"/api/v1/jobs/{job['id']}/report/").json()
    variants = report["devices"][0]["variants"]
    assert {(v["precision"], v["backend"]) for v in variants} == {("fp32", "onnxruntime"), ("fp32", "openvino"), ("int8", "onnxruntime"), ("int8", "openvino")}
    # OpenVINO's INT8 is NNCF's IR built on OpenVINO's own model, not ONNX Runtime's QDQ file (issue 24).
    assert {(v["key"], v["backend"]) for v in variants if v["precision"] == "int8"} == {("int8", "onnxruntime"), ("ov-int8", "openvino")}
    for variant in variants:
        assert variant["status"] == "succeeded", variant["error"]
        assert variant["latency_ms"]["p50"] > 0 and variant["accuracy"]["accuracy"] > 0.9
        assert variant["profile"]["by_op_type"], variant["profile"]
    assert report["devices"][0]["recommended"] in {v["id"] for v in variants}
    # What the report says about accuracy can be reproduced from the downloaded artifact.
    fp32_ort = next(v for v in variants if v["precision"] == "fp32" and v["backend"] == "onnxruntime")
    model_bytes = api.get(fp32_ort["variant_artifact"]["download_url"]).content
    validation = np.load(model_files["validation"])
    predictions = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"]).run(None, {"input": validation["input"]})[0]
    assert abs(float((predictions.argmax(1) == validation["labels"]).mean()) - fp32_ort["accuracy"]["accuracy"]) < 1e-9
    assert with_openvino.poll() is None and without_openvino.poll() is None


def test_agent_killed_mid_task_loses_nothing_and_the_task_runs_once_more(kiln_stack, api_for, model_files, settings):
    settings.BENCHMARK_MIN_SECONDS = 6
    api, tenant = api_for("carol", "Carols")
    ids = upload_digits(api, model_files)
    job = api.post("/api/v1/jobs/", json={"model_version": ids["version"], "precisions": ["fp32"], "targets": ["pool=x"],
                                          "validation_dataset": ids["validation"]})
    doomed = kiln_stack.start_agent(tenant, "doomed", labels={"pool": "x"}, backends="onnxruntime")
    task = wait_until(lambda: DeviceTask.objects.filter(job_id=job["id"], stage="benchmark").first(), timeout=90, message="the task to be benchmarking")
    os.killpg(doomed.pid, signal.SIGKILL)
    doomed.wait()
    settings.BENCHMARK_MIN_SECONDS = 0.3
    kiln_stack.start_agent(tenant, "survivor", labels={"pool": "x"}, backends="onnxruntime")
    job = api.wait_for_job(job["id"], kiln_stack)
    assert job["status"] == "succeeded", (job["events"], kiln_stack.logs())
    task.refresh_from_db()
    assert task.status == DeviceTaskStatus.SUCCEEDED
    assert task.attempt == 2
    assert task.leased_by.name == "survivor"
    assert DeviceTask.objects.filter(job_id=job["id"]).count() == 1
    assert any("lost its agent" in e["message"] for e in job["events"])


def test_revoked_agent_gets_401_and_stops(kiln_stack, api_for):
    api, tenant = api_for("dan", "Dans")
    process = kiln_stack.start_agent(tenant, "victim")
    agent = wait_until(lambda: next((a for a in api.get("/api/v1/agents/").json() if a["online"]), None), timeout=30, message="the agent online")
    api.post(f"/api/v1/agents/{agent['id']}/revoke/", expect=200)
    wait_until(lambda: process.poll() is not None, timeout=30, message="the agent to exit")
    assert process.returncode == 3
    assert "401" in process.log_path.read_text() or "revoked" in process.log_path.read_text().lower()


def test_cancel_reaches_a_running_agent_and_it_takes_the_next_job(kiln_stack, api_for, model_files, settings):
    settings.BENCHMARK_MIN_SECONDS = 120
    api, tenant = api_for("erin", "Erins")
    ids = upload_digits(api, model_files)
    agent = kiln_stack.start_agent(tenant, "busy", backends="onnxruntime")
    job = api.post("/api/v1/jobs/", json={"model_version": ids["version"], "precisions": ["fp32"], "validation_dataset": ids["validation"]})
    task = wait_until(lambda: DeviceTask.objects.filter(job_id=job["id"], stage="benchmark").first(), timeout=90, message="benchmarking")
    api.post(f"/api/v1/jobs/{job['id']}/cancel/", expect=200)
    # The heartbeat is 2 s here: the agent must drop the two-minute benchmark long before it ends.
    wait_until(lambda: "canceled by the server" in agent.log_path.read_text(), timeout=20, message="the agent to learn of the cancel")
    task.refresh_from_db()
    assert task.status == DeviceTaskStatus.CANCELED and task.metrics == {}
    assert api.get(f"/api/v1/jobs/{job['id']}/").json()["status"] == "canceled"

    settings.BENCHMARK_MIN_SECONDS = 0.3
    follow_up = api.post("/api/v1/jobs/", json={"model_version": ids["version"], "precisions": ["fp32"], "validation_dataset": ids["validation"]})
    assert api.wait_for_job(follow_up["id"], kiln_stack)["status"] == "succeeded"
    assert agent.poll() is None


def test_corrupted_artifact_fails_only_its_task_with_the_reason(kiln_stack, api_for, model_files):
    from kiln.pipeline.models import Variant
    from kiln.registry.selectors import blob_file

    api, tenant = api_for("fred", "Freds")
    ids = upload_digits(api, model_files)
    job = api.post("/api/v1/jobs/", json={"model_version": ids["version"], "precisions": ["fp32", "int8-dynamic"], "validation_dataset": ids["validation"]})
    api.wait_for_job(job["id"], kiln_stack, statuses=("waiting_for_devices", "failed"))
    # Bit rot on the server's disk: the bytes no longer match the digest the lease announces.
    damaged = blob_file(Variant.objects.get(job_id=job["id"], key="int8-dynamic").artifact.blob)
    intact = damaged.read_bytes()
    damaged.write_bytes(intact[:-16] + b"\0" * 16)
    kiln_stack.start_agent(tenant, "careful", backends="onnxruntime")
    try:
        job = api.wait_for_job(job["id"], kiln_stack)
    finally:
        # Blobs are content-addressed and shared by every test of the run: a later build of the
        # same bytes would find this damaged file under their digest.
        damaged.write_bytes(intact)
    assert job["status"] == "succeeded", job["events"]
    tasks = {t["variant"]: t for t in job["device_tasks"] if t["purpose"] == "measure"}
    variants = {v["key"]: v["id"] for v in job["variants"]}
    assert tasks[variants["int8-dynamic"]]["status"] == "failed"
    assert "sha256 mismatch" in tasks[variants["int8-dynamic"]]["error"]
    assert tasks[variants["fp32"]]["status"] == "succeeded"


def test_sigterm_hands_the_task_back_and_the_agent_exits_cleanly(kiln_stack, api_for, model_files, settings):
    settings.AGENT_LEASE_SECONDS = 300  # so that only a hand-back, not a lease expiry, can requeue it
    settings.BENCHMARK_MIN_SECONDS = 120
    api, tenant = api_for("gina", "Ginas")
    ids = upload_digits(api, model_files)
    job = api.post("/api/v1/jobs/", json={"model_version": ids["version"], "precisions": ["fp32"], "targets": ["pool=y"],
                                          "validation_dataset": ids["validation"]})
    leaving = kiln_stack.start_agent(tenant, "leaving", labels={"pool": "y"}, backends="onnxruntime")
    task = wait_until(lambda: DeviceTask.objects.filter(job_id=job["id"], stage="benchmark").first(), timeout=90, message="benchmarking")
    os.killpg(leaving.pid, signal.SIGTERM)
    assert leaving.wait(timeout=30) == 0
    task.refresh_from_db()
    assert task.status == DeviceTaskStatus.QUEUED and task.leased_by is None
    settings.BENCHMARK_MIN_SECONDS = 0.3
    kiln_stack.start_agent(tenant, "staying", labels={"pool": "y"}, backends="onnxruntime")
    assert api.wait_for_job(job["id"], kiln_stack)["status"] == "succeeded"
    task.refresh_from_db()
    assert task.attempt == 2 and task.leased_by.name == "staying"
