"""Raw data without NumPy: a recipe proposed from the model, and a preview of what it makes before anything is stored."""
from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest
from PIL import Image

from kiln.registry.recipes import IMAGENET_MEAN, propose_recipe
from tests.conftest import upload

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def private_storage(settings, tmp_path):
    settings.BLOB_ROOT = tmp_path / "blobs"


def image_zip(path, *, count: int = 6, size=(24, 24), mode: str = "L", folders: bool = True):
    rng = np.random.default_rng(0)
    with zipfile.ZipFile(path, "w") as archive:
        for index in range(count):
            buffer = io.BytesIO()
            shape = size if mode == "L" else (*size, 3)
            Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(buffer, format="JPEG")
            name = f"{'cat' if index % 2 else 'dog'}/{index}.jpg" if folders else f"{index}.jpg"
            archive.writestr(name, buffer.getvalue())
    return path


def test_a_colour_classifier_gets_its_size_layout_and_imagenet_normalisation():
    signature = {"inputs": [{"name": "pixel_values", "dtype": "float32", "shape": ["batch", 3, 224, 224]}],
                 "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 1000]}]}
    proposal = propose_recipe(signature=signature, output_kinds={"logits": {"kind": "class_scores"}})
    recipe = proposal["recipe"]
    assert (recipe["input"], recipe["size"], recipe["layout"], recipe["color"], recipe["dtype"]) == ("pixel_values", [224, 224], "NCHW", "RGB", "float32")
    assert recipe["mean"] == IMAGENET_MEAN and recipe["resize"] == "shorter_side_crop"
    assert any("ImageNet" in reason for reason in proposal["why"])


def test_a_detector_in_nhwc_with_free_size_gets_plain_pixels_and_a_default_size():
    signature = {"inputs": [{"name": "images", "dtype": "float32", "shape": [1, "h", "w", 3]}], "outputs": [{"name": "boxes", "shape": [1, 84, 8400]}]}
    proposal = propose_recipe(signature=signature, output_kinds={"boxes": {"kind": "detection"}})
    recipe = proposal["recipe"]
    assert (recipe["layout"], recipe["size"], recipe["mean"], recipe["std"]) == ("NHWC", [224, 224], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0])
    assert any("not fixed" in reason for reason in proposal["why"])


def test_uint8_input_takes_raw_pixels_and_token_ids_get_a_text_recipe():
    uint8 = propose_recipe(signature={"inputs": [{"name": "x", "dtype": "uint8", "shape": [1, 3, 32, 32]}], "outputs": []}, output_kinds={})
    assert (uint8["recipe"]["dtype"], uint8["recipe"]["scale"]) == ("uint8", 1.0)
    text = propose_recipe(signature={"inputs": [{"name": "input_ids", "dtype": "int64", "shape": ["b", 64]},
                                                {"name": "attention_mask", "dtype": "int64", "shape": ["b", 64]}], "outputs": []}, output_kinds={})
    assert text["recipe"]["inputs"] == {"input_ids": "ids", "attention_mask": "attention_mask"} and text["recipe"]["max_length"] == 64


def test_a_model_raw_data_cannot_feed_says_so():
    proposal = propose_recipe(signature={"inputs": [{"name": "features", "dtype": "float32", "shape": ["b", 12]}], "outputs": []}, output_kinds={})
    assert proposal["recipe"] is None and ".npz" in proposal["why"][0]


def test_proposal_preview_and_upload_of_a_folder_of_jpegs_through_the_api(tenant, other_tenant, model_files, tmp_path):
    model = upload(tenant.client, "/api/v1/models/", model_files["model"]).json()
    proposal = tenant.client.get(f"/api/v1/models/{model['id']}/versions/1/recipe/").json()
    assert proposal["recipe"]["input"] == "input" and proposal["recipe"]["size"] == [8, 8] and proposal["recipe"]["color"] == "L"
    # Another organization cannot read it.
    assert other_tenant.client.get(f"/api/v1/models/{model['id']}/versions/1/recipe/").status_code == 404

    photos = image_zip(tmp_path / "photos.zip", mode="RGB")
    preview = upload(tenant.client, "/api/v1/datasets/preview/", photos, recipe=json.dumps(proposal["recipe"]),
                     model_version=model["versions"][0]["id"])
    assert preview.status_code == 200, preview.content
    body = preview.json()
    assert body["files"] == 6 and len(body["previews"]) == 4
    assert body["arrays"]["input"]["shape"] == [1, 8, 8] and body["arrays"]["input"]["dtype"] == "float32"
    assert body["previews"][0]["thumbnail"].startswith("data:image/png;base64,") and body["previews"][0]["label"] in ("cat", "dog")
    assert body["fits"] == {"ok": True, "problems": []}
    # Nothing was stored.
    assert tenant.client.get("/api/v1/datasets/").json()["count"] == 0

    wrong = dict(proposal["recipe"], size=[16, 16])
    misfit = upload(tenant.client, "/api/v1/datasets/preview/", photos, recipe=json.dumps(wrong), model_version=model["versions"][0]["id"]).json()
    assert misfit["fits"]["ok"] is False and "16 where it needs 8" in misfit["fits"]["problems"][0]

    created = upload(tenant.client, "/api/v1/datasets/", photos, kind="validation", recipe=json.dumps(proposal["recipe"]))
    assert created.status_code == 201 and created.json()["samples"] == 6 and created.json()["has_labels"] is True


def test_a_zip_of_images_without_a_recipe_points_to_the_proposal_not_to_numpy(tenant, tmp_path):
    answer = upload(tenant.client, "/api/v1/datasets/", image_zip(tmp_path / "photos.zip"), kind="calibration")
    assert answer.status_code == 400
    message = answer.json()["error"]
    assert "numpy" not in message.lower() and "recipe" in message and "6 images" in message


def test_a_bad_recipe_or_a_file_that_is_not_a_zip_is_a_4xx_with_a_message(tenant, tmp_path):
    photos = image_zip(tmp_path / "photos.zip")
    assert upload(tenant.client, "/api/v1/datasets/preview/", photos, recipe="{not json").status_code == 400
    other = tmp_path / "notes.zip"
    other.write_text("not a zip")
    answer = upload(tenant.client, "/api/v1/datasets/preview/", other, recipe=json.dumps({"type": "image", "size": [8, 8]}))
    assert answer.status_code == 400 and "not a zip" in answer.json()["error"]
