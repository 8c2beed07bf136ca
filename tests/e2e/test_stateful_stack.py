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
    assert set(variants) == {"fp32", "int8"}, ([(v["key"], v["status"], v["error"]) for v in job["variants"]], [e["message"] for e in job["events"]])
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


def wav_zip(path, count: int, seed: int):
    """Recordings as a user holds them: WAV files, half at 8 kHz (resampled by the recipe)."""
    import io
    import zipfile

    import soundfile

    from tests.fixtures.zoo import VAD_RATE, _voiced

    rng = np.random.default_rng(seed)
    with zipfile.ZipFile(path, "w") as archive:
        for index in range(count):
            rate = VAD_RATE if index % 2 == 0 else 8000
            seconds = 0.32
            sound = _voiced(rng, int(seconds * rate)) if index % 3 != 2 else 0.003 * rng.standard_normal(int(seconds * rate))
            buffer = io.BytesIO()
            soundfile.write(buffer, sound.astype(np.float32), rate, format="WAV")
            archive.writestr(f"clip-{index:02d}.wav", buffer.getvalue())
    return path


@pytest.mark.skipif(SILERO_VAD.path is None, reason="silero-vad is not installed (it is in the dev extra)")
def test_wav_files_chunked_by_a_recipe_stream_through_the_vad_with_state(kiln_stack, tmp_path):
    import json

    tenant = kiln_stack.create_user("wanda", "a-long-password-1", "Audio Labs")
    api = Api(kiln_stack.url, tenant.token)
    version = api.upload("/api/v1/models/", SILERO_VAD.path, name="silero-vad")["versions"][0]
    recipe = {"type": "audio", "input": "input", "sample_rate": 16000, "resample": True, "length": 5120, "chunk": 512,
              "context": 64, "constants": {"sr": 16000}}
    path = wav_zip(tmp_path / "clips.zip", 6, seed=3)
    with open(path, "rb") as handle:
        response = api.session.post(api.url + "/api/v1/datasets/", files={"file": ("clips.zip", handle)},
                                    data={"kind": "validation", "recipe": json.dumps(recipe)}, timeout=120)
    assert response.status_code == 201, response.text[:500]
    dataset = response.json()
    assert dataset["arrays"] == {"input": {"dtype": "float32", "shape": [6, 10, 1, 576]}, "sr": {"dtype": "int64", "shape": [6, 10]}}
    assert [preview["seconds"] for preview in dataset["previews"]] == [0.32] * 4
    kiln_stack.start_agent(tenant, "cpu", backends="onnxruntime")
    job = api.post("/api/v1/jobs/", json={"model_version": version["id"], "precisions": ["fp32"], "validation_dataset": dataset["id"],
                                          "state": SILERO_VAD.state})
    job = api.wait_for_job(job["id"], kiln_stack, timeout=600)
    assert job["status"] == "succeeded", (job["error"], [e["message"] for e in job["events"]])
    accuracy = api.get(f"/api/v1/jobs/{job['id']}/report/").json()["devices"][0]["variants"][0]["accuracy"]
    assert accuracy["sequences"] == 6 and [row["step"] for row in accuracy["per_step"]] == list(range(10))

    # The package takes the same WAV files: it resamples, chunks and streams them with state as Kiln did.
    import io
    import subprocess
    import sys
    import zipfile

    artifacts = api.get(f"/api/v1/jobs/{job['id']}/artifacts/").json()
    package = next(a for a in artifacts if a["kind"] == "package")
    root = tmp_path / "package"
    with zipfile.ZipFile(io.BytesIO(api.get(package["download_url"]).content)) as archive:
        archive.extractall(root)
    ran = subprocess.run([sys.executable, "run.py", str(path), "--save-outputs", str(tmp_path / "outputs.npz")], cwd=root,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    reference = next(a for a in artifacts if a["name"] == "reference-outputs.npz")
    (tmp_path / "reference.npz").write_bytes(api.get(reference["download_url"]).content)
    with np.load(tmp_path / "outputs.npz") as ours, np.load(tmp_path / "reference.npz") as theirs:
        assert theirs["output"].shape == (60, 1, 1)
        np.testing.assert_allclose(ours["output"], theirs["output"], atol=1e-5)
        np.testing.assert_allclose(ours["stateN"], theirs["stateN"], atol=1e-5)
