"""A real streaming model through the real stack: Silero VAD, an LSTM fed one audio chunk per call
with its state (`[2, batch, 128]`, batch on axis 1) carried from `stateN` to `state` and a scalar
int64 `sr`. Sequences go in as stacked arrays; fp32 and int8 come back with per-step accuracy, and
the FP32 reference the devices were judged against is the model run call by call here, by hand.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from tests.e2e.test_pipeline_stack import Api
from tests.fixtures.models import write_npz
from tests.fixtures.zoo import SILERO_VAD

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

STEPS = 10


def by_hand(model_path, sequences: dict) -> np.ndarray:
    """VAD probabilities of every call, state carried the way silero_vad's own wrapper does."""
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    probabilities = []
    for chunks, rates in zip(sequences["input"], sequences["sr"]):
        state = np.zeros((2, 1, 128), np.float32)
        for chunk, rate in zip(chunks, rates):
            output, state = session.run(["output", "stateN"], {"input": chunk, "state": state, "sr": np.array(rate)})
            probabilities.append(output)
    return np.stack(probabilities)


@pytest.mark.skipif(SILERO_VAD.path is None, reason="silero-vad is not installed (it is in the dev extra)")
def test_stateful_vad_runs_fp32_and_int8_to_a_report_with_per_step_accuracy(kiln_stack, tmp_path):
    tenant = kiln_stack.create_user("vera", "a-long-password-1", "Voice Labs")
    api = Api(kiln_stack.url, tenant.token)
    calibration = write_npz(tmp_path / "calibration.npz", **SILERO_VAD.sequences(6, STEPS, seed=1))
    validation_sequences = SILERO_VAD.sequences(4, STEPS, seed=2)
    validation = write_npz(tmp_path / "validation.npz", **validation_sequences)
    model = api.upload("/api/v1/models/", SILERO_VAD.path, name="silero-vad")
    version = model["versions"][0]
    calibration_id = api.upload("/api/v1/datasets/", calibration, kind="calibration")["id"]
    validation_id = api.upload("/api/v1/datasets/", validation, kind="validation")["id"]

    # Without the state mapping the data cannot be fed (state has no array): a 400 that says so.
    refused = api.post("/api/v1/jobs/", expect=400, json={"model_version": version["id"], "precisions": ["fp32"],
                                                          "validation_dataset": validation_id})
    assert refused["code"] == "dataset_mismatch" and "missing array for model input 'state'" in refused["error"], refused
    kiln_stack.start_agent(tenant, "cpu", backends="onnxruntime")
    job = api.post("/api/v1/jobs/", json={
        "model_version": version["id"], "precisions": ["fp32", "int8"], "calibration_dataset": calibration_id,
        "validation_dataset": validation_id, "state": SILERO_VAD.state, "initial_state": {"state": 0},
        "tolerance": {"metric": "cosine", "max_drop": 0.5},
    })
    assert job["feeds"]["validation"]["mode"] == "sequences"
    job = api.wait_for_job(job["id"], kiln_stack, timeout=780)
    assert job["status"] == "succeeded", (job["error"], [e["message"] for e in job["events"]])

    report = api.get(f"/api/v1/jobs/{job['id']}/report/").json()
    assert report["datasets"]["state"] == {"stateN": "state"}
    assert report["datasets"]["calibration_used"]["calls"] == 6 * STEPS
    variants = {v["precision"]: v for v in report["devices"][0]["variants"]}
    assert set(variants) == {"fp32", "int8"}
    for precision, variant in variants.items():
        accuracy = variant["accuracy"]
        assert accuracy["calls"] == 4 * STEPS and accuracy["sequences"] == 4, precision
        steps = accuracy["per_step"]
        assert [row["step"] for row in steps] == list(range(STEPS))
        assert all(row["sequences"] == 4 and set(row["outputs"]) == {"output", "stateN"} for row in steps)
    # FP32 on the device matches FP32 on the host call for call; int8 is measured, not copied.
    assert all(row["outputs"]["output"]["max_abs_error"] < 1e-4 for row in variants["fp32"]["accuracy"]["per_step"])
    assert any(row["outputs"]["stateN"]["max_abs_error"] > 1e-4 for row in variants["int8"]["accuracy"]["per_step"])

    reference_id = next(a["id"] for a in api.get(f"/api/v1/jobs/{job['id']}/artifacts/").json() if a["name"] == "reference-outputs.npz")
    reference_file = tmp_path / "reference.npz"
    reference_file.write_bytes(api.get(f"/api/v1/artifacts/{reference_id}/download/").content)
    with np.load(reference_file, allow_pickle=False) as reference:
        expected = by_hand(SILERO_VAD.path, validation_sequences)
        np.testing.assert_allclose(reference["output"], expected, atol=1e-5)
    assert expected.max() > 0.5 > expected.min(), "the voiced sequences must be heard as voice for the test to mean anything"
