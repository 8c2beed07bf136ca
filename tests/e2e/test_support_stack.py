"""Operator support before compiling, end to end: a model OpenVINO cannot read costs OpenVINO only, with its reason."""
from __future__ import annotations

import importlib.util

import numpy as np
import onnx
import pytest

from kiln.pipeline.models import DeviceTask
from tests.conftest import wait_until
from tests.e2e.test_pipeline_stack import api_for  # noqa: F401  (fixture)
from tests.fixtures.models import build_loop_decoder, write_npz

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300),
              pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="needs OpenVINO installed to refuse the model")]


def test_a_loop_decoder_openvino_cannot_read_is_skipped_on_openvino_before_any_build_and_runs_on_onnx_runtime(kiln_stack, api_for, tmp_path):  # noqa: F811
    api, tenant = api_for("dora", "Decoders")
    model_path = tmp_path / "decoder.onnx"
    onnx.save(build_loop_decoder(), model_path)
    features = np.random.default_rng(3).standard_normal((8, 8)).astype(np.float32)
    validation = write_npz(tmp_path / "validation.npz", features=features)
    agent = kiln_stack.start_agent(tenant, "both-runtimes", backends="onnxruntime,openvino")
    model = api.upload("/api/v1/models/", model_path, name="decoder")
    dataset = api.upload("/api/v1/datasets/", validation, name="val", kind="validation")
    wait_until(lambda: any(a["online"] for a in api.get("/api/v1/agents/").json()), timeout=30, message="the agent online")
    job = api.post("/api/v1/jobs/", json={"model_version": model["versions"][0]["id"], "precisions": ["fp32"], "validation_dataset": dataset["id"]})
    job = api.wait_for_job(job["id"], kiln_stack)
    assert job["status"] == "succeeded", (job["error"], job["events"], kiln_stack.logs())

    # The support stage named OpenVINO's refusal, and the Loop, before anything was built.
    skipped = job["support"]["skipped"]
    assert set(skipped) == {"openvino"}
    assert "cannot read the model" in skipped["openvino"] and "Loop 'decoder'" in skipped["openvino"]
    answers = {a["backend"]: a for a in job["support"]["answers"]}
    assert answers["onnxruntime"]["verdict"] == "runs" and answers["onnxruntime"]["native"]["Loop"] == 1
    messages = [(e["stage"], e["message"]) for e in job["events"]]
    refused = next(i for i, (stage, message) in enumerate(messages) if stage == "support" and "Skipped openvino" in message)
    first_build = next(i for i, (stage, message) in enumerate(messages) if stage == "quantize" and message.startswith("Built "))
    assert refused < first_build
    assert [s["name"] for s in job["stages"]][:4] == ["validate", "convert", "support", "reference"]

    # OpenVINO costs nothing more: no device task for it; ONNX Runtime measured the model and its agent answered too.
    tasks = list(DeviceTask.objects.filter(job_id=job["id"]))
    assert [t.backend for t in tasks] == ["onnxruntime"] and tasks[0].status == "succeeded"
    assert tasks[0].support["verdict"] == "runs" and tasks[0].support["backend"] == "onnxruntime"
    report = api.get(f"/api/v1/jobs/{job['id']}/report/").json()
    [device] = report["devices"]
    assert [v["backend"] for v in device["variants"]] == ["onnxruntime"] and device["recommended"]

    # The model page holds what the server's runtimes and the agent's said.
    version = api.get(f"/api/v1/models/{model['id']}/").json()["versions"][0]
    said = {(a["where"], a["backend"]): a for a in version["operator_support"]["answers"]}
    assert said[("server", "openvino")]["verdict"] == "cannot_run"
    assert said[("both-runtimes", "onnxruntime")]["verdict"] == "runs"
    assert agent.poll() is None
