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


def shapes_zip(path, classes: dict[str, int], *, size=(40, 30)):
    """Class folders of RGB JPEGs, in zip order class after class (as a folder of photos is packed)."""
    rng = np.random.default_rng(3)
    with zipfile.ZipFile(path, "w") as archive:
        for label, count in classes.items():
            for index in range(count):
                buffer = io.BytesIO()
                Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8), "RGB").save(buffer, format="JPEG")
                archive.writestr(f"{label}/{index:03d}.jpg", buffer.getvalue())
    return path


def test_the_preview_counts_every_class_and_shows_one_file_of_each_as_the_tensor_the_model_gets(tenant, tmp_path):
    """The first files of a folder are all one class: the preview shows one of each, with the class counts, and each
    thumbnail is the prepared tensor itself (resized and cropped), not the photo."""
    recipe = {"type": "image", "input": "pixels", "size": [16, 16], "resize": "shorter_side_crop", "color": "RGB", "scale": "1/255",
              "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25], "layout": "NCHW"}
    photos = shapes_zip(tmp_path / "shapes.zip", {"circle": 10, "square": 10, "star": 7, "triangle": 3})
    body = upload(tenant.client, "/api/v1/datasets/preview/", photos, recipe=json.dumps(recipe)).json()
    assert body["classes"] == {"circle": 10, "square": 10, "star": 7, "triangle": 3} and body["files"] == 30
    assert [p["label"] for p in body["previews"]] == ["circle", "square", "star", "triangle"]
    assert body["recipe"]["scale"] == pytest.approx(1 / 255)
    # The thumbnail holds the tensor's pixels: 16x16 shown as whole 6x6 blocks, equal to the crop decode_image makes.
    from kiln_contract.recipes import decode_image, parse_recipe

    first = Image.open(io.BytesIO(__import__("base64").b64decode(body["previews"][0]["thumbnail"].split(",", 1)[1])))
    assert first.size == (96, 96) and body["previews"][0]["size"] == [16, 16]
    with zipfile.ZipFile(photos) as archive:
        crop = np.asarray(decode_image(archive.read("circle/000.jpg"), parse_recipe(recipe)), np.int16)
    shown = np.asarray(first.convert("RGB"), np.int16)[::6, ::6]
    assert np.abs(shown - crop).max() <= 1

    # A folder too big to send whole: the zip holds the files to show, `names` lists every file chosen.
    sample = shapes_zip(tmp_path / "sample.zip", {"circle": 1, "square": 1})
    names = "\n".join([*(f"circle/{i:03d}.jpg" for i in range(40)), *(f"square/{i:03d}.jpg" for i in range(25)), "notes.txt"])
    counted = upload(tenant.client, "/api/v1/datasets/preview/", sample, recipe=json.dumps(recipe), names=names).json()
    assert counted["classes"] == {"circle": 40, "square": 25} and counted["files"] == 65 and len(counted["previews"]) == 2


def test_a_dataset_names_the_digest_of_the_files_it_was_made_from(tenant, tmp_path):
    """Two uploads of the same folder are the same files, whatever their kind: the deploy form warns on that."""
    recipe = {"type": "image", "input": "pixels", "size": [8, 8], "color": "RGB"}
    photos = shapes_zip(tmp_path / "shapes.zip", {"circle": 2, "square": 2})
    first = upload(tenant.client, "/api/v1/datasets/", photos, kind="calibration", recipe=json.dumps(recipe)).json()
    second = upload(tenant.client, "/api/v1/datasets/", photos, kind="validation", recipe=json.dumps(recipe)).json()
    import hashlib

    assert first["source_sha256"] == second["source_sha256"] == hashlib.sha256(photos.read_bytes()).hexdigest()
    assert tenant.client.get(f"/api/v1/datasets/{first['id']}/").json()["source_sha256"] == first["source_sha256"]
