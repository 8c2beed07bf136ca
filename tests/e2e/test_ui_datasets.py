"""Browser tests of the dataset parts of the UI: raw images uploaded with a recipe show the recipe
and thumbnails of their first samples, a corrupt image is refused by name, and the new-deployment
form sends a state mapping and a seeded calibration subset, and a sequence job's report draws its
per-step accuracy and the calibration samples drawn. Real server, worker, agent and Chromium."""
from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest

from tests.e2e import test_ui as ui
from tests.e2e.test_stateful_stack import STEPS
from tests.e2e.test_ui import api, new_user, screenshot, select_containing, sign_in, wait_for_page
from tests.fixtures.models import write_npz
from tests.fixtures.zoo import SILERO_VAD

# The browser, the live stack and the digits files are test_ui's fixtures, shared here.
browser, digits_files, new_page, stack, ui_dist = ui.browser, ui.digits_files, ui.new_page, ui.stack, ui.ui_dist

pytestmark = [pytest.mark.browser, pytest.mark.integration]

RECIPE = {"type": "image", "input": "input", "size": [8, 8], "color": "L", "scale": 0.0625, "layout": "NCHW"}


def digit_zip(path, *, broken: bool = False):
    from PIL import Image

    rng = np.random.default_rng(0)
    with zipfile.ZipFile(path, "w") as archive:
        for index in range(6):
            buffer = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (24, 24), dtype=np.uint8)).save(buffer, format="PNG")
            archive.writestr(f"{'seven' if index % 2 else 'three'}/{index}.png", buffer.getvalue())
        if broken:
            archive.writestr("three/scan-9.png", b"\x89PNG\r\n\x1a\n truncated")
    return path


def test_raw_images_with_a_recipe_show_thumbnails_and_a_corrupt_one_is_named(stack, new_page, tmp_path):
    from playwright.sync_api import expect

    user = new_user(stack, "rita", "Recipes")
    page = new_page()
    sign_in(page, user)
    page.goto("/datasets")
    page.get_by_test_id("dataset-name-input").fill("digit scans")
    page.get_by_test_id("dataset-kind-select").select_option("validation")
    page.get_by_test_id("dataset-recipe-input").fill(json.dumps(RECIPE))
    page.get_by_test_id("dataset-upload-input").set_input_files(str(digit_zip(tmp_path / "scans.zip")))
    # A zip through a recipe is previewed first (issue 27); the upload starts from the preview.
    expect(page.get_by_test_id("raw-preview")).to_contain_text("6 files")
    page.get_by_test_id("raw-preview-upload").click()
    row = page.get_by_test_id("dataset-row").filter(has_text="digit scans")
    expect(row).to_be_visible(timeout=60_000)
    expect(row.get_by_test_id("dataset-samples")).to_have_text("6")
    expect(row.get_by_test_id("dataset-recipe")).to_contain_text("images → input: 8×8 stretch, L")
    expect(row.get_by_test_id("dataset-recipe")).to_contain_text("labels from folders: seven, three")
    thumbnails = row.get_by_test_id("dataset-previews").locator("img")
    expect(thumbnails).to_have_count(4)
    # The thumbnails really render under the server's Content-Security-Policy (data: images).
    wait_for_page(page, "() => [...document.querySelectorAll('[data-testid=dataset-previews] img')].every(i => i.complete && i.naturalWidth > 0)")
    screenshot(page, "20-datasets-recipe")

    page.get_by_test_id("dataset-upload-input").set_input_files(str(digit_zip(tmp_path / "broken.zip", broken=True)))
    page.get_by_test_id("raw-preview-upload").click()
    item = page.get_by_test_id("upload-item").filter(has_text="broken.zip")
    expect(item).to_have_attribute("data-status", "error", timeout=60_000)
    expect(item.get_by_test_id("upload-error")).to_contain_text("three/scan-9.png: not an image Pillow can read")
    assert len(api(stack, user, "GET", "datasets/").json()["results"]) == 1


def test_new_deployment_sends_the_state_mapping_and_calibration_subset(stack, new_page, digits_files):
    from playwright.sync_api import expect

    user = new_user(stack, "sami", "Streams")
    with open(digits_files["model"], "rb") as handle:
        model = api(stack, user, "POST", "models/", data={"name": "digits"}, files={"file": ("digits.onnx", handle)}).json()
    with open(digits_files["validation"], "rb") as handle:
        api(stack, user, "POST", "datasets/", data={"kind": "calibration", "name": "labelled digits"},
            files={"file": ("validation.npz", handle)}).raise_for_status()
    page = new_page()
    sign_in(page, user)
    page.goto(f"/deployments/new?model={model['id']}")
    select_containing(page.get_by_test_id("calibration-select"), "labelled digits")
    feeds = page.get_by_test_id("dataset-feeds")
    feeds.get_by_test_id("subset-count").fill("30")
    feeds.get_by_test_id("subset-seed").fill("5")
    # A state row names an output and the input it feeds; the digits CNN has none to carry, so the
    # server refuses it with its reason, shown on the form.
    feeds.get_by_test_id("add-state").click()
    feeds.get_by_test_id("state-output").select_option("logits")
    feeds.get_by_test_id("state-input").select_option("input")
    page.get_by_role("button", name="Start deployment").click()
    expect(page.get_by_role("alert").filter(has_text="is fed from the state mapping")).to_be_visible(timeout=30_000)
    screenshot(page, "21-deployment-state-refused")
    feeds.get_by_role("button", name="Remove").click()
    page.get_by_role("button", name="Start deployment").click()
    page.wait_for_url("**/jobs/*", timeout=30_000)
    job_id = int(page.url.rstrip("/").split("/")[-1])
    job = api(stack, user, "GET", f"jobs/{job_id}/").json()
    assert job["feeds"]["calibration_subset"] == {"count": 30, "seed": 5, "stratify": True}


def wait_for_job(stack, user, job_id: int, timeout: float) -> dict:
    import time

    deadline = time.monotonic() + timeout
    while True:
        job = api(stack, user, "GET", f"jobs/{job_id}/").json()
        if job["status"] in ("succeeded", "failed", "canceled") or time.monotonic() > deadline:
            return job
        time.sleep(2)


@pytest.mark.timeout(900)
@pytest.mark.skipif(SILERO_VAD.path is None, reason="silero-vad is not installed (it is in the dev extra)")
def test_a_sequence_jobs_report_draws_per_step_accuracy_and_the_calibration_samples_drawn(stack, new_page, tmp_path):
    """Silero VAD fed call by call with its state: the report page draws each variant's cosine per step
    and says which calibration sequences the seeded subset chose."""
    from playwright.sync_api import expect

    user = new_user(stack, "vera", "Voice")
    with open(SILERO_VAD.path, "rb") as handle:
        model = api(stack, user, "POST", "models/", data={"name": "silero-vad"}, files={"file": ("silero_vad.onnx", handle)}).json()
    ids = {}
    for kind, count, seed in (("calibration", 6, 1), ("validation", 3, 2)):
        path = write_npz(tmp_path / f"{kind}.npz", **SILERO_VAD.sequences(count, STEPS, seed=seed))
        with open(path, "rb") as handle:
            response = api(stack, user, "POST", "datasets/", data={"kind": kind}, files={"file": (path.name, handle)})
        assert response.status_code == 201, response.text
        ids[kind] = response.json()["id"]
    # ONNX Runtime only: one fp32 and one int8 line per chart.
    stack.start_agent(user.tenant, "cpu", backends="onnxruntime")
    created = api(stack, user, "POST", "jobs/", json={
        "model_version": model["versions"][0]["id"], "precisions": ["fp32", "int8"], "calibration_dataset": ids["calibration"],
        "validation_dataset": ids["validation"], "state": SILERO_VAD.state, "initial_state": {"state": 0},
        "calibration_subset": {"count": 4, "seed": 5}, "tolerance": {"metric": "cosine", "max_drop": 0.5}})
    assert created.status_code == 201, created.text
    job = wait_for_job(stack, user, created.json()["id"], timeout=780)
    assert job["status"] == "succeeded", (job["error"], [event["message"] for event in job["events"]])
    used = api(stack, user, "GET", f"jobs/{job['id']}/report/").json()["datasets"]["calibration_used"]

    page = new_page()
    sign_in(page, user)
    page.goto(f"/jobs/{job['id']}/report")
    per_step = page.get_by_test_id("per-step-accuracy").first
    expect(per_step).to_be_visible(timeout=30_000)
    chart = per_step.get_by_test_id("per-step-chart-output")
    expect(chart.get_by_role("img", name="Cosine per step of output, one line per variant")).to_be_visible()
    expect(chart.locator("polyline")).to_have_count(2)
    expect(per_step).to_contain_text("over 3 sequences")
    table = per_step.get_by_test_id("per-step-table")
    expect(table.get_by_role("row").filter(has_text="int8").filter(has_text="stateN")).to_contain_text(str(STEPS))
    calibration = page.get_by_test_id("calibration-subset")
    expect(calibration.get_by_test_id("calibration-summary")).to_have_text(
        f"4 of 6 samples ({4 * STEPS} calls), drawn with seed 5, not stratified (the set has no labels).")
    expect(calibration.get_by_test_id("calibration-indices")).to_contain_text(", ".join(str(index) for index in used["indices"]))
    screenshot(page, "22-report-per-step-calibration")
