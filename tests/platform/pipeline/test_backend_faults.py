"""A backend's fault costs that backend only: a job whose device offers ONNX Runtime and OpenVINO finishes on ONNX Runtime
when OpenVINO cannot read the model or misreads an INT8 variant, and "why not the others" says why (issue 24).

A real agent's TaskRunner (devices/agent/runner.py, in this process) leases, runs and reports the job's tasks over the real
agent API of a live server; the host stages run eagerly.
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from rest_framework.test import APIClient

from devices.agent.client import AgentClient, RetryPolicy
from devices.agent.runner import TaskRunner
from kiln.pipeline.models import DeviceTask
from tests.agreement import assert_decision_agrees
from tests.conftest import upload
from tests.fixtures.models import build_loop_decoder, write_npz

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="needs OpenVINO to refuse or misread a model")]

BOTH_RUNTIMES = {"runtimes": {"onnxruntime": "1.32.0", "openvino": "2026.4.1"}, "cores": 2, "cpu_model": "Test CPU", "agent_version": "0.1.0"}


@pytest.fixture(autouse=True)
def short_measurements(settings, tmp_path, monkeypatch):
    from devices import quiet

    settings.BLOB_ROOT = tmp_path / "blobs"
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.AGENT_LONG_POLL_SECONDS = 0
    settings.BENCHMARK_MIN_RUNS, settings.BENCHMARK_MIN_SECONDS = 5, 0.0
    settings.BENCHMARK_WARMUP_RUNS, settings.BENCHMARK_WARMUP_SECONDS = 1, 0.0
    # The windows are timed on a busy test machine: none is re-taken for it.
    monkeypatch.setenv(quiet.QUIET_DIR_ENV, str(tmp_path / "quiet"))
    monkeypatch.setenv(quiet.BUSY_CORES_ENV, "1000")


def agent_with_both_runtimes(tenant, live_server, tmp_path) -> tuple[AgentClient, TaskRunner]:
    secret = tenant.client.post("/api/v1/agents/registration-tokens/", {"name": "lab"}, format="json").json()["token"]
    answer = APIClient().post("/api/agent/v1/register", {"registration_token": secret, "name": "both-runtimes", "capabilities": BOTH_RUNTIMES},
                              format="json").json()
    client = AgentClient(live_server.url, answer["agent_token"], sleep=lambda s: None, retry=RetryPolicy(max_attempts=2, base_s=0.0, cap_s=0.0))
    return client, TaskRunner(client, tmp_path / "agent", threads=1)


def run_every_task(client: AgentClient, runner: TaskRunner) -> dict[str, str]:
    """Lease and run tasks until the queue is empty; backend -> outcome."""
    outcomes = {}
    while (task := client.lease(wait_s=0)) is not None:
        outcomes[f"{task['variant']['key']} on {task['backend']}"] = runner.run(task)
    return outcomes


def failed_row(device: dict, backend: str) -> dict:
    return next(row for row in device["decision"]["alternatives"] if row["outcome"] == "failed" and row["label"].endswith(f"on {backend}"))


def deploy_loop_decoder(tenant, tmp_path, capture) -> int:
    """A job for the Loop decoder OpenVINO 2026.4 cannot read, on a server that could not ask its runtimes first (no sandbox)."""
    (tmp_path / "decoder.onnx").write_bytes(build_loop_decoder().SerializeToString())
    validation = write_npz(tmp_path / "validation.npz", features=np.random.default_rng(3).standard_normal((8, 8)).astype(np.float32))
    version = upload(tenant.client, "/api/v1/models/", tmp_path / "decoder.onnx", name="decoder").json()["versions"][0]["id"]
    dataset = upload(tenant.client, "/api/v1/datasets/", validation, kind="validation").json()["id"]
    with capture(execute=True):
        response = tenant.client.post("/api/v1/jobs/", {"model_version": version, "precisions": ["fp32"], "validation_dataset": dataset},
                                      format="json")
    return response.json()["id"]


@pytest.fixture
def no_sandbox(monkeypatch):
    from kiln.pipeline import support as support_stage
    from workers.support import SupportCheckFailed

    def unavailable(*args, **kwargs):
        raise SupportCheckFailed("the sandbox is not available on this host")

    # The support stage cannot ask the server's runtimes: OpenVINO's refusal first shows when the variant is built.
    monkeypatch.setattr(support_stage, "check_isolated", unavailable)


def finished_report(tenant, job_id: int) -> dict:
    report = tenant.client.get(f"/api/v1/jobs/{job_id}/report/").json()
    assert report["status"] == "succeeded", report
    [device] = report["devices"]
    [chosen] = [v for v in device["variants"] if v["id"] == device["recommended"]]
    assert chosen["backend"] == "onnxruntime"
    assert_decision_agrees(device)
    return device


def test_a_model_openvino_cannot_read_is_built_for_onnx_runtime_only_and_why_not_names_openvinos_reason(
        tenant, live_server, tmp_path, no_sandbox, django_capture_on_commit_callbacks):
    client, runner = agent_with_both_runtimes(tenant, live_server, tmp_path)
    job_id = deploy_loop_decoder(tenant, tmp_path, django_capture_on_commit_callbacks)

    assert run_every_task(client, runner) == {"fp32 on onnxruntime": "succeeded"}
    device = finished_report(tenant, job_id)
    row = next(row for row in device["decision"]["alternatives"] if row["outcome"] == "refused")
    assert row["label"].endswith("on openvino")
    assert row["why"].startswith("never reached the device: the backend cannot read this model: OpenVINO 2026.4")
    assert "cannot read the model (inside Loop 'decoder')" in row["why"]
    events = [event["message"] for event in tenant.client.get(f"/api/v1/jobs/{job_id}/").json()["events"]]
    assert any(message.startswith("fp32 is not measured on openvino: OpenVINO") for message in events), events


def test_a_device_whose_openvino_cannot_read_what_the_servers_read_fails_that_task_only_with_its_reason(
        tenant, live_server, tmp_path, no_sandbox, monkeypatch, django_capture_on_commit_callbacks):
    from kiln.pipeline import quantize

    real_build = quantize.build_isolated

    def servers_openvino_reads_it(**kwargs):
        built = real_build(**kwargs)
        return {**built, "backends": ["onnxruntime", "openvino"], "refused_backends": {}}

    # The server's OpenVINO (another version than the device's) read the model: the device is the first to refuse it.
    monkeypatch.setattr(quantize, "build_isolated", servers_openvino_reads_it)
    client, runner = agent_with_both_runtimes(tenant, live_server, tmp_path)
    job_id = deploy_loop_decoder(tenant, tmp_path, django_capture_on_commit_callbacks)

    assert run_every_task(client, runner) == {"fp32 on onnxruntime": "succeeded", "fp32 on openvino": "failed"}
    device = finished_report(tenant, job_id)
    refused = DeviceTask.objects.get(job_id=job_id, backend="openvino")
    assert refused.support["verdict"] == "cannot_run" and "compiled in" not in refused.log  # refused before anything was built
    row = failed_row(device, "openvino")
    assert row["why"].startswith("the backend cannot read this model: OpenVINO 2026.4") and "Loop 'decoder'" in row["why"]


def test_an_int8_ir_far_from_its_fp32_source_is_a_runtime_fault_in_why_not_the_others_and_the_job_ends_on_onnx_runtime(
        tenant, model_files, live_server, tmp_path, monkeypatch, django_capture_on_commit_callbacks):
    from devices.backends.openvino import OpenVinoCompiledModel

    real_run = OpenVinoCompiledModel.run
    # OpenVINO misreads the INT8 IR (issue 24's detector): outputs unrelated to what the variant computes.
    monkeypatch.setattr(OpenVinoCompiledModel, "run", lambda self, feeds: {k: -v for k, v in real_run(self, feeds).items()})
    client, runner = agent_with_both_runtimes(tenant, live_server, tmp_path)
    version = upload(tenant.client, "/api/v1/models/", model_files["model"], name="digits").json()["versions"][0]["id"]
    calibration = upload(tenant.client, "/api/v1/datasets/", model_files["calibration"], kind="calibration").json()["id"]
    validation = upload(tenant.client, "/api/v1/datasets/", model_files["validation"], kind="validation").json()["id"]
    with django_capture_on_commit_callbacks(execute=True):
        job = tenant.client.post("/api/v1/jobs/", {"model_version": version, "precisions": ["int8"], "calibration_dataset": calibration,
                                                   "validation_dataset": validation}, format="json").json()

    assert run_every_task(client, runner) == {"int8 on onnxruntime": "succeeded", "ov-int8 on openvino": "failed"}
    device = finished_report(tenant, job["id"])
    faulty = DeviceTask.objects.get(job_id=job["id"], backend="openvino")
    # The check is kept with the task; the fault is not the variant's accuracy.
    assert faulty.metrics["runtime_check"]["against"] == "fp32 source on onnxruntime" and faulty.metrics["runtime_check"]["fault"] is True
    assert faulty.accuracy == {}
    row = failed_row(device, "openvino")
    assert "runtime fault: openvino INT8 IR disagrees with its FP32 source on ONNX Runtime: cosine -1.000" in row["why"]
    # The CLI reads the same report; the job's events name the fault too.
    events = [event["message"] for event in tenant.client.get(f"/api/v1/jobs/{job['id']}/").json()["events"]]
    assert any("ov-int8 on openvino failed: runtime fault" in message for message in events), events
