"""Browser tests of issue 37: what a first-time device engineer tripped on, with a model kind nobody had used in the UI (a
MobileNet-like `.pt2` image classifier) and a folder of JPEGs in class folders.

Same stack and fixtures as test_ui.py (real server, Celery worker, Chromium). The host builds are real (the worker
exports, calibrates and quantizes); the device is a scripted agent over the real agent API, because what is tested is
how the pages read, and a report's verdict (a fast INT8 build that misses the tolerance) cannot be chosen from a real
runtime. Screenshots land in test-artifacts/screenshots/37-*.png; with KILN_DOCS_SCREENSHOTS=1 the deploy form, the
dataset preview and the Performance page at 1366 and 390 px are also written to docs/images/ (the guide shows them).
"""
from __future__ import annotations

import os
import re
import time
import zipfile
from pathlib import Path

import pytest
import requests

from tests.e2e import test_ui as ui
from tests.e2e.test_ui import JOB_TIMEOUT_MS, REPO, api, new_user, screenshot, sign_in, wait_for_page
from tests.e2e.test_ui_guides import registration_token
from tests.fixtures.torch_models import SHAPES, save_image_classifier, shape_photos

browser, new_page, stack, ui_dist, digits_files = ui.browser, ui.new_page, ui.stack, ui.ui_dist, ui.digits_files

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.timeout(900)]

DOCS_IMAGES = REPO / "docs" / "images"
CLASSES = dict(zip(SHAPES, (10, 10, 7, 3), strict=True))
# The .pt2's export and parity check run inside the upload request; on a loaded 2-core machine that takes a while.
UPLOAD_TIMEOUT_MS = 300_000
BF16_ISA = ["avx2", "avx512f", "avx512_bf16"]


def docs_screenshot(page, name: str) -> None:
    """A screenshot for the test's record, and for docs/images/ when KILN_DOCS_SCREENSHOTS=1 (refreshing the guide's)."""
    # From the top: a full-page shot of a scrolled page draws the sticky top bar where the window was.
    page.evaluate("window.scrollTo(0, 0)")
    screenshot(page, name)
    if os.environ.get("KILN_DOCS_SCREENSHOTS") == "1":
        from PIL import Image

        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        # 256 colours hold a UI screenshot without visible loss, at a third of the bytes the docs carry.
        with Image.open(ui.SCREENSHOTS / f"{name}.png") as image:
            image.convert("RGB").quantize(colors=256).save(DOCS_IMAGES / f"{name.removeprefix('37-')}.png", optimize=True)


def fits_the_window(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")


# -- the device: a scripted agent over the real agent API ---------------------------------------

def scripted_device(stack, user, name: str, *, isa: list[str], runtimes: dict[str, str]) -> requests.Session:
    body = requests.post(f"{stack.url}/api/agent/v1/register", timeout=30, json={
        "registration_token": registration_token(stack, user), "name": name,
        "capabilities": {"runtimes": runtimes, "isa": isa, "cores": 2, "logical_cores": 2, "cpu_model": "Scripted Xeon", "agent_version": "0.1.0"}}).json()
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {body['agent_token']}"
    return session


def profile(op_histogram: dict, p50: float) -> dict:
    """A per-operator profile in ONNX's operator names, each type's share of the p50 by its node count."""
    nodes = sum(op_histogram.values())
    return {"runs": 10, "warmup_runs": 1, "total_ms": p50,
            "by_op_type": [{"op_type": op, "time_ms": p50 * count / nodes, "share": count / nodes, "count": count} for op, count in op_histogram.items()]}


def answer_until_done(stack, user, agent: requests.Session, job_id: int, answers: dict, op_histogram: dict) -> dict:
    """Lease the job's tasks and answer each by its variant key ({key: (p50 ms, top-1 agreement)}); decline re-timing."""
    deadline = time.monotonic() + JOB_TIMEOUT_MS / 1000
    while time.monotonic() < deadline:
        response = agent.post(f"{stack.url}/api/agent/v1/tasks/lease", json={"wait_s": 1}, timeout=30)
        if response.status_code == 200:
            task = response.json()
            if task["retime"]:
                declined = {"attempt": task["attempt"], "status": "failed", "error": "this scripted agent does not re-time"}
                assert agent.post(f"{stack.url}/api/agent/v1/tasks/{task['id']}/result", json=declined, timeout=30).status_code == 200
                continue
            p50, top1 = answers[task["variant"]["key"]]
            latency = {"p50": p50, "p90": p50 * 1.02, "p99": p50 * 1.05, "mean": p50, "std": 0.01 * p50, "cv": 0.01, "count": 200}
            result = {"attempt": task["attempt"], "status": "succeeded", "error": "",
                      "metrics": {"latency_ms": latency, "runs": 200, "unstable": False, "threads": 2, "batch_size": 1,
                                  "by_batch": [{"batch_size": 1, "latency_ms": latency, "runs": 200, "unstable": False, "window_medians_ms": [p50] * 3}]},
                      "accuracy": {"cosine": 0.5 + top1 / 2, "sqnr_db": 40.0 * top1, "top1_agreement": top1, "max_abs_error": 1 - top1},
                      "profile": profile(op_histogram, p50)}
            assert agent.post(f"{stack.url}/api/agent/v1/tasks/{task['id']}/result", json=result, timeout=30).status_code == 200
            continue
        job = api(stack, user, "GET", f"jobs/{job_id}/").json()
        if job["status"] in ("succeeded", "failed", "canceled"):
            assert job["status"] == "succeeded", (job["error"], [event["message"] for event in job["events"]][-8:])
            return job
    raise AssertionError(f"job {job_id} did not finish")


def upload_model(stack, user, path: Path, name: str) -> dict:
    with open(path, "rb") as handle:
        response = requests.post(f"{stack.url}/api/v1/models/", headers={"Authorization": f"Bearer {user.token}"}, data={"name": name},
                                 files={"file": (path.name, handle)}, timeout=UPLOAD_TIMEOUT_MS / 1000)
    assert response.status_code == 201, response.text[:500]
    return response.json()


def photos_zip(folder: Path, path: Path) -> Path:
    """The same photos zipped by a user's own tool (other bytes than the folder the browser packs)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for image in sorted(folder.rglob("*.jpg")):
            archive.write(image, image.relative_to(folder).as_posix())
    return path


def top_of(page, test_id: str) -> float:
    return page.get_by_test_id(test_id).bounding_box()["y"]


# -- from a .pt2 and a folder of JPEGs to a deployment -----------------------------------------

def test_a_pt2_and_a_folder_of_jpegs_preview_every_class_and_the_form_chooses_and_says_the_obvious(stack, new_page, tmp_path):
    """Items 2, 3, 4 and 8 (the recipe's 1/255, a zip without a recipe, points) of issue 37, and the form's search budget
    (issue 33): upload in the browser, preview the folder, deploy with what the form chose, read the job's variants."""
    from playwright.sync_api import expect

    user = new_user(stack, "nadia", "Shapes Lab")
    # A device with OpenVINO on bf16 units: `auto` tries bf16 there, and the form can say so.
    device = scripted_device(stack, user, "sapphire-rapids-bench", isa=BF16_ISA, runtimes={"onnxruntime": "1.32.0", "openvino": "2026.4.1"})
    model_path = save_image_classifier(tmp_path / "shapes-net.pt2")
    photos = shape_photos(tmp_path / "shapes", CLASSES)

    page = new_page(1366, 900)
    sign_in(page, user)
    # The Models page says a .pt2 is welcome; the upload goes through the file picker.
    expect(page.locator(".page-header p").first).to_contain_text("a torch.export .pt2 or a traced .pt")
    page.get_by_test_id("model-name-input").fill("shapes-net")
    page.get_by_test_id("model-upload-input").set_input_files(str(model_path))
    expect(page.get_by_test_id("upload-item").first).to_have_attribute("data-status", "done", timeout=UPLOAD_TIMEOUT_MS)
    model = api(stack, user, "GET", "models/").json()["results"][0]

    # Item 3 at 390 px first (then cancelled), then at 1366 px, uploaded: every class, one thumbnail each, as the model gets it.
    for width in (390, 1366):
        page = new_page(width, 900)
        sign_in(page, user)
        page.goto(f"/datasets?model={model['id']}")
        recipe = page.get_by_test_id("dataset-recipe-input")
        expect(recipe).to_have_value(re.compile(r'"scale": "1/255"'))  # item 8: not 0.00392156862745098
        page.get_by_test_id("dataset-name-input").fill("shapes")
        page.get_by_test_id("dataset-upload-folder-input").set_input_files(str(photos))
        preview = page.get_by_test_id("raw-preview")
        expect(preview.get_by_test_id("raw-preview-classes")).to_have_text(
            "Labels from the class folders: 4 classes: circle 10, square 10, star 7, triangle 3.", timeout=60_000)
        samples = preview.get_by_test_id("raw-preview-sample")
        expect(samples).to_have_count(4)
        assert [text.split(" · ")[0] for text in samples.all_inner_texts()] == list(SHAPES)
        expect(preview.get_by_test_id("raw-preview-as-fed")).to_have_text(
            "One file of each class, as the model gets it: resized and centre-cropped to 32×32.")
        expect(preview.get_by_test_id("raw-preview-tensors")).to_contain_text("float32 [3, 32, 32]")
        expect(preview.get_by_test_id("raw-preview-fits")).to_contain_text("Fits shapes-net")
        wait_for_page(page, "[...document.querySelectorAll('[data-testid=raw-preview-samples] img')].every(i => i.complete && i.naturalWidth === 96)")
        assert fits_the_window(page)
        docs_screenshot(page, f"37-dataset-preview-{width}")
        if width == 390:
            page.get_by_test_id("raw-preview-cancel").click()
            continue
        page.get_by_test_id("raw-preview-upload").click()
        expect(page.get_by_test_id("dataset-row").filter(has_text="shapes")).to_be_visible(timeout=120_000)

    # The same folder again, as validation: the preview says these are the calibration files.
    page.get_by_test_id("dataset-kind-select").select_option("validation")
    page.get_by_test_id("dataset-name-input").fill("shapes-again")
    page.get_by_test_id("dataset-upload-folder-input").set_input_files(str(photos))
    expect(page.get_by_test_id("raw-preview-same-files")).to_contain_text("the same files as the calibration dataset “shapes”", timeout=60_000)
    page.get_by_test_id("raw-preview-upload").click()
    expect(page.get_by_test_id("dataset-row").filter(has_text="shapes-again")).to_be_visible(timeout=120_000)

    # Item 8: a zip of JPEGs chosen with no recipe is offered the model's recipe in one click, then previewed.
    page = new_page(1366, 900)
    sign_in(page, user)
    page.goto("/datasets")
    expect(page.get_by_test_id("dataset-recipe-input")).to_have_value("")
    page.get_by_test_id("dataset-upload-input").set_input_files(str(photos_zip(photos, tmp_path / "shapes.zip")))
    offer = page.get_by_test_id("zip-needs-recipe")
    expect(offer).to_contain_text("shapes.zip holds 30 image or WAV files and no arrays")
    offer.get_by_role("button", name="Use shapes-net's recipe").click()
    expect(page.get_by_test_id("raw-preview-classes")).to_contain_text("4 classes: circle 10, square 10, star 7, triangle 3", timeout=60_000)
    expect(page.get_by_test_id("dataset-recipe-input")).to_have_value(re.compile(r'"scale": "1/255"'))
    page.get_by_test_id("raw-preview-cancel").click()
    assert api(stack, user, "GET", "datasets/").json()["count"] == 2

    # Online for the form (a heartbeat), though this device never takes the job's work: the test reads the host's builds.
    assert device.post(f"{stack.url}/api/agent/v1/heartbeat", json={"capabilities": {"runtimes": {"onnxruntime": "1.32.0", "openvino": "2026.4.1"},
                                                                                     "isa": BF16_ISA}}, timeout=30).ok
    # Item 4: the form chooses the only dataset that fits each slot, says what auto judges and in what unit, warns that
    # calibration and validation are the same files, and does not move when the calibration choice changes.
    for width in (390, 1366):
        page = new_page(width, 900)
        sign_in(page, user)
        page.goto(f"/deployments/new?model={model['id']}")
        expect(page.get_by_test_id("calibration-compatibility")).to_contain_text("the only one that fits, chosen for you")
        expect(page.get_by_test_id("validation-compatibility")).to_contain_text("the only one that fits, chosen for you")
        expect(page.get_by_test_id("metric-help")).to_have_text(re.compile(r"^For this model and “shapes-again” \(labelled\): top-1 accuracy of output “\S+” against its labels\.$"))
        expect(page.get_by_test_id("max-drop-meaning")).to_have_text("1% = 1 point of top-1 accuracy: with FP32 at 90%, a variant at 89% still passes.")
        expect(page.get_by_test_id("form-warnings")).to_contain_text("“shapes” and “shapes-again” are the same files")
        expect(page.get_by_test_id("budget-input")).to_have_value("10")
        assert fits_the_window(page)
        docs_screenshot(page, f"37-deploy-form-{width}")
    calibration = page.get_by_test_id("calibration-select")
    chosen = calibration.input_value()
    below = top_of(page, "precision-auto")
    calibration.select_option("")
    assert top_of(page, "precision-auto") == below
    calibration.select_option(chosen)
    assert top_of(page, "precision-auto") == below
    expect(page.get_by_test_id("calibration-samples")).to_be_enabled()
    page.get_by_test_id("budget-input").fill("5")
    page.get_by_test_id("start-deployment").click()
    expect(page).to_have_url(re.compile(r"/jobs/\d+$"), timeout=30_000)
    job_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    assert api(stack, user, "GET", f"jobs/{job_id}/").json()["budget"]["minutes"] == 5

    # The job's header names what auto reads once the reference is made, in points.
    expect(page.get_by_test_id("job-tolerance")).to_have_text("top-1 accuracy may drop by at most 1 point", timeout=120_000)
    # Item 2: every variant names what it computes in, and where it runs or why not (never a bare dash).
    rows = page.get_by_test_id("variant-row")
    expect(rows.filter(has_text="bf16").first).to_be_visible(timeout=120_000)

    def builds_ended() -> bool:
        variants = api(stack, user, "GET", f"jobs/{job_id}/").json()["variants"]
        return bool(variants) and all(variant["status"] in ("ready", "skipped", "failed") for variant in variants)

    # A round's builds (NNCF's INT8 among them) take a minute on a quiet 2-core machine and several on a loaded one.
    deadline = time.monotonic() + 600
    while not builds_ended():
        assert time.monotonic() < deadline, "the round's builds did not end"
        time.sleep(2)
    bf16 = page.locator('[data-testid="variant-row"][data-key="bf16"]')
    expect(bf16.get_by_test_id("variant-precision")).to_have_text("bf16fp32 build")
    expect(bf16.get_by_test_id("variant-runs-on")).to_have_text("openvino")
    for cell in page.get_by_test_id("variant-runs-on").all():
        assert cell.inner_text().strip() not in ("", "—"), cell.inner_text()
    variants = {variant["key"]: variant for variant in api(stack, user, "GET", f"jobs/{job_id}/").json()["variants"]}
    assert (variants["bf16"]["precision"], variants["bf16"]["effective_precision"]) == ("fp32", "bf16")
    for key, variant in variants.items():
        if not variant["backends"]:
            row = page.locator(f'[data-testid="variant-row"][data-key="{key}"]')
            expect(row.get_by_test_id("variant-runs-on")).to_contain_text("none")
            if variant["error"]:
                expect(row.get_by_test_id("variant-runs-on")).to_contain_text(variant["error"][:40])
    screenshot(page, "37-job-variants")
    api(stack, user, "POST", f"jobs/{job_id}/cancel/")


# -- the Performance page, the estimate, the devices page and the polish ------------------------

def test_which_device_answers_within_tolerance_the_estimate_has_a_range_and_the_pages_read(stack, new_page, digits_files, tmp_path):
    """Items 1, 7 and 8 (estimate, chart range, operator support, subtitle and docs link) of issue 37."""
    import onnx
    from playwright.sync_api import expect

    from tests.fixtures.models import build_transformer_like

    user = new_user(stack, "omar", "Bench Lab")
    agent = scripted_device(stack, user, "xeon-bench", isa=["avx2", "avx512f"], runtimes={"onnxruntime": "1.32.0"})
    # Two other kinds of model measured on the device first: a small CNN and an encoder, each with a per-operator profile.
    onnx.save(build_transformer_like(), str(tmp_path / "encoder.onnx"))
    for name, path, p50 in (("digits", digits_files["model"], 1.0), ("encoder", tmp_path / "encoder.onnx", 3.0)):
        other = upload_model(stack, user, Path(path), name)
        version = other["versions"][0]
        job = api(stack, user, "POST", "jobs/", json={"model_version": version["id"], "precisions": ["fp32"]}).json()
        answer_until_done(stack, user, agent, job["id"], {"fp32": (p50, 1.0)}, version["op_histogram"])
    shapes = upload_model(stack, user, save_image_classifier(tmp_path / "shapes-net.pt2"), "shapes-net")
    version = shapes["versions"][0]

    page = new_page(1366, 900)
    sign_in(page, user)
    expect(page.get_by_role("heading", name="Models", level=1)).to_be_visible()
    expect(page.locator(".page-header p").first).to_contain_text("ONNX, or PyTorch")
    docs = page.get_by_test_id("docs-link")
    expect(docs).to_have_attribute("href", "/docs/")
    assert page.request.get(docs.get_attribute("href")).status == 200

    # Item 8: a kind of model never measured here gets an estimate from what operators cost on the device, with its range.
    page.goto(f"/models/{shapes['id']}")
    row = page.get_by_test_id("latency-estimate").get_by_test_id("estimate-row").filter(has_text="xeon-bench")
    expect(row.get_by_test_id("estimate-range")).to_have_text(re.compile(r"^[\d.,]+–[\d.,]+ ms$"))
    expect(row.get_by_test_id("estimate-note")).to_contain_text("either way: the worst miss when each of the 2 models measured here was predicted from the others")
    estimate = next(d for d in api(stack, user, "GET", f"performance/estimate/?model_version={version['id']}").json()["devices"] if d["agent"]["name"] == "xeon-bench")
    assert estimate["low_ms"] < estimate["p50_ms"] < estimate["high_ms"] and estimate["checked_models"] == 2
    # Item 8 at 390 px: the operator-support cards keep a count whole, and a runtime that itemises nothing says so.
    page.set_viewport_size({"width": 390, "height": 900})
    support = page.get_by_test_id("model-operator-support")
    expect(support.locator("tr[data-backend]").first).to_be_visible(timeout=180_000)
    for cell in support.get_by_test_id("support-native").all():
        assert not re.match(r"^0\b", cell.inner_text().strip()), cell.inner_text()
    counts = support.locator("[data-testid=support-native] .nowrap")
    for index in range(counts.count()):
        assert counts.nth(index).evaluate("e => e.getClientRects().length") == 1, counts.nth(index).inner_text()
    litert = support.locator('tr[data-backend="litert"]')
    if litert.count():
        expect(litert.get_by_test_id("support-native")).not_to_have_text("0 —")
    assert fits_the_window(page)
    screenshot(page, "37-model-390")

    # Item 1: an INT8 build four times faster that misses the tolerance does not answer "which device should I buy?".
    job = api(stack, user, "POST", "jobs/", json={"model_version": version["id"], "precisions": ["fp32", "int8-dynamic"],
                                                  "tolerance": {"metric": "top1_agreement", "max_drop": 0.01}}).json()
    answer_until_done(stack, user, agent, job["id"], {"fp32": (102.7, 1.0), "int8-dynamic": (22.9, 0.947)}, version["op_histogram"])
    for width in (1366, 390):
        page = new_page(width, 900)
        sign_in(page, user)
        page.goto("/performance")
        page.get_by_label("Model", exact=True).select_option(label="shapes-net")
        caption = page.get_by_test_id("device-chart-caption")
        expect(caption).to_contain_text("the p50 of the fastest variant within its job's accuracy tolerance")
        expect(caption).to_contain_text("1 faster variant outside the tolerance is left out")
        bar = page.get_by_test_id("device-chart").locator("li").filter(has_text="xeon-bench")
        expect(bar).to_contain_text("102.7 ms")
        expect(bar.get_by_test_id("device-pick")).to_have_text("fp32 on onnxruntime · recommended · 1 faster outside the tolerance")
        assert fits_the_window(page)
        docs_screenshot(page, f"37-performance-{width}")

    # Item 8: the chart's zoom range reads at the precision its width needs.
    page.goto(f"/jobs/{job['id']}/report")
    expect(page.get_by_test_id("zoom-range").first).to_have_text(re.compile(r"^[\d,]+(\.\d{1,3})?–[\d,]+(\.\d{1,3})? ms$"), timeout=30_000)

    # Item 7: the loopback warning offers this machine's own addresses; a device without labels says so, not "None".
    page.goto("/devices")
    warning = page.get_by_test_id("loopback-warning")
    expect(warning).to_contain_text("will not work from a device")
    suggestions = api(stack, user, "GET", "agents/setup/").json()["suggested_urls"]
    if suggestions:
        expect(warning.get_by_test_id("suggested-address").first).to_have_text(f"Use {suggestions[0]}")
        warning.get_by_test_id("suggested-address").first.click()
        expect(page.get_by_test_id("server-address-input")).to_have_value(suggestions[0])
    agent_row = page.get_by_test_id("agent-row").filter(has_text="xeon-bench")
    expect(agent_row.get_by_test_id("no-labels")).to_have_text("no labels")
    expect(agent_row).not_to_contain_text("None")
