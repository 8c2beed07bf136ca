"""PyTorch in, end to end with real processes: a .pt2 and a traced .pt each go upload -> convert (parity) ->
variants -> device reports, through the live server, a Celery worker process and a kiln-agent process."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from tests.e2e.test_pipeline_stack import Api
from tests.fixtures import torch_models
from tests.fixtures.models import write_npz

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
# The export runs inside the upload request; on a loaded 2-core machine it can take over a minute.
UPLOAD_TIMEOUT = 300


def upload_model(api: Api, path) -> dict:
    with open(path, "rb") as handle:
        response = api.session.post(api.url + "/api/v1/models/", data={"name": path.name}, files={"file": (path.name, handle)}, timeout=UPLOAD_TIMEOUT)
    assert response.status_code == 201, response.text[:500]
    return response.json()


def test_pt2_and_torchscript_go_from_upload_to_device_reports(kiln_stack, tmp_path):
    tenant = kiln_stack.create_user("pat", "a-long-password-1", "Torch Shop")
    api = Api(kiln_stack.url, tenant.token)
    rng = np.random.default_rng(3)
    calibration = write_npz(tmp_path / "calibration.npz", x=rng.standard_normal((16, 1, 8, 8)).astype(np.float32))
    validation_inputs = rng.standard_normal((10, 1, 8, 8)).astype(np.float32)
    validation = write_npz(tmp_path / "validation.npz", x=validation_inputs)
    calibration_id = api.upload("/api/v1/datasets/", calibration, kind="calibration")["id"]
    validation_id = api.upload("/api/v1/datasets/", validation, kind="validation")["id"]
    kiln_stack.start_agent(tenant, "cpu", backends="onnxruntime")
    expected = torch_models.tiny_net()(__import__("torch").from_numpy(validation_inputs)).detach().numpy()

    uploads = {"torch-export": torch_models.save_export(tmp_path / "tiny.pt2"), "torchscript": torch_models.save_torchscript(tmp_path / "tiny.pt")}
    for source_format, path in uploads.items():
        version = upload_model(api, path)["versions"][0]
        assert version["source_format"] == source_format and version["conversion"]["parity"]["passed"]
        job = api.post("/api/v1/jobs/", json={"model_version": version["id"], "precisions": ["fp32", "int8"], "calibration_dataset": calibration_id,
                                              "validation_dataset": validation_id, "tolerance": {"metric": "cosine", "max_drop": 0.01}})
        job = api.wait_for_job(job["id"], kiln_stack, timeout=420)
        assert job["status"] == "succeeded", (job["error"], [e["message"] for e in job["events"]])
        convert = next(stage for stage in job["stages"] if stage["name"] == "convert")
        assert "parity passed" in convert["message"], convert
        parity_events = [e["message"] for e in job["events"] if e["stage"] == "convert" and "Parity of" in e["message"]]
        # Ten validation samples through the batch-2 export: five batches, none padded.
        assert parity_events and "on 10 samples" in parity_events[0], parity_events
        artifacts = {a["name"]: a for a in api.get(f"/api/v1/jobs/{job['id']}/artifacts/").json()}
        # The original PyTorch file stays an artifact, byte for byte.
        assert api.get(artifacts[path.name]["download_url"]).content == path.read_bytes()

        report = api.get(f"/api/v1/jobs/{job['id']}/report/").json()
        variants = report["devices"][0]["variants"]
        assert {v["precision"] for v in variants} == {"fp32", "int8"}
        for variant in variants:
            assert variant["status"] == "succeeded" and variant["latency_ms"]["p50"] > 0, variant
        fp32 = next(v for v in variants if v["precision"] == "fp32")
        session = ort.InferenceSession(api.get(fp32["variant_artifact"]["download_url"]).content, providers=["CPUExecutionProvider"])
        got = np.concatenate([session.run(None, {"x": validation_inputs[i:i + 2]})[0] for i in range(0, 10, 2)])
        np.testing.assert_allclose(got, expected, atol=1e-4)
