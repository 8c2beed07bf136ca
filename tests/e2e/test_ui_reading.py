"""Browser tests of issue 27: a chart that reads, a tolerance in percent, a device set-up that works off this host,
tables that fit at 1366, 800 and 390 px, and defaults that do not mislead.

Same stack and fixtures as test_ui.py (real server, Celery worker, Chromium). Where a test is about how a report
reads, a scripted agent answers over the real agent API with chosen timings and accuracies (a collapsed INT8
variant cannot be chosen from a real runtime). Screenshots land in test-artifacts/screenshots/27-*.png.
"""
from __future__ import annotations

import contextlib
import re
import time

import pytest

from tests.e2e import test_ui as ui
from tests.e2e.test_ui import JOB_TIMEOUT_MS, api, new_user, screenshot, sign_in, wait_for_page
from tests.e2e.test_ui_guides import scripted_agent

browser, new_page, stack, ui_dist, digits_files = ui.browser, ui.new_page, ui.stack, ui.ui_dist, ui.digits_files

pytestmark = [pytest.mark.browser, pytest.mark.integration]

WIDTHS = (1366, 800, 390)


def no_sideways_scroll(page) -> bool:
    """No page-level sideways scroll, once the layout has settled (the chart redraws at its new width after a resize)."""
    # Still too wide after the wait: the culprits are named below.
    with contextlib.suppress(AssertionError):
        wait_for_page(page, "document.documentElement.scrollWidth <= window.innerWidth + 1", timeout_ms=3000)
    fits = page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    if not fits:
        # Name the widest culprits, for the failure message.
        print("wider than the window:", page.evaluate("""() => [...document.querySelectorAll('body *')]
            .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
            .slice(-6).map(e => `${e.tagName}.${e.className}[${e.dataset.testid || ''}] ${Math.round(e.getBoundingClientRect().right)}`)"""))
    return fits


# -- a scripted agent over the real agent API ---------------------------------------------------

def run_scripted_job(stack, user, agent, model: dict, answers: dict, tolerance: dict, calibration: int | None = None) -> dict:
    """Deploy the model's first version in the precisions `answers` names ({precision: (p50 ms, top-1 agreement)})."""
    job = api(stack, user, "POST", "jobs/", json={"model_version": model["versions"][0]["id"], "precisions": list(answers),
                                                  "tolerance": tolerance, "calibration_dataset": calibration}).json()
    deadline = time.monotonic() + JOB_TIMEOUT_MS / 1000
    while time.monotonic() < deadline:
        response = agent.post(f"{stack.url}/api/agent/v1/tasks/lease", json={"wait_s": 1}, timeout=30)
        if response.status_code == 200:
            task = response.json()
            p50, top1 = answers[task["variant"]["precision"]]
            latency = {"p50": p50, "p90": p50, "p99": p50 * 1.05, "mean": p50, "std": 0.01 * p50, "cv": 0.01, "count": 200}
            result = {"attempt": task["attempt"], "status": "succeeded", "error": "",
                      "metrics": {"latency_ms": latency, "runs": 200, "unstable": False, "threads": 4, "batch_size": 1,
                                  "by_batch": [{"batch_size": 1, "latency_ms": latency, "runs": 200, "unstable": False, "window_medians_ms": [p50] * 3}]},
                      "accuracy": {"cosine": 0.5 + top1 / 2, "sqnr_db": 40.0 * top1, "top1_agreement": top1, "max_abs_error": 1 - top1},
                      "profile": openvino_like_profile(p50)}
            assert agent.post(f"{stack.url}/api/agent/v1/tasks/{task['id']}/result", json=result, timeout=30).status_code == 200
            continue
        current = api(stack, user, "GET", f"jobs/{job['id']}/").json()
        if current["status"] in ("succeeded", "failed", "canceled"):
            assert current["status"] == "succeeded", current.get("error")
            return current
    raise AssertionError(f"job {job['id']} did not finish")


def openvino_like_profile(p50: float) -> dict:
    """A profile as OpenVINO's agent sends it: runtime node names, each with the model's nodes it runs."""
    nodes = [("Multiply_615451", "Convolution", 0.6, ["conv1", "relu1"]), ("conv2/WithoutBiases", "Convolution", 0.3, ["conv2", "relu2"]),
             ("logits", "FullyConnected", 0.1, ["fc"])]
    return {"runs": 10, "warmup_runs": 1, "total_ms": p50,
            "by_op_type": [{"op_type": "Convolution", "time_ms": 0.9 * p50, "share": 0.9, "count": 2},
                           {"op_type": "FullyConnected", "time_ms": 0.1 * p50, "share": 0.1, "count": 1}],
            "by_node": [{"name": name, "op_type": op, "time_ms": share * p50, "share": share, "layers": layers} for name, op, share, layers in nodes]}


def upload_model(stack, user, digits_files, name: str = "digits") -> dict:
    with open(digits_files["model"], "rb") as handle:
        return api(stack, user, "POST", "models/", data={"name": name}, files={"file": ("digits.onnx", handle)}).json()


# The dynamic INT8 build collapses (top-1 agreement 0.31): it must not squash the axis the other three share.
ANSWERS = {"fp32": (4.0, 1.0), "fp16": (2.6, 0.996), "int8": (1.9, 0.992), "int8-dynamic": (1.7, 0.31)}


def upload_calibration(stack, user, digits_files) -> int:
    with open(digits_files["calibration"], "rb") as handle:
        return api(stack, user, "POST", "datasets/", data={"name": "digits-calibration", "kind": "calibration"},
                   files={"file": ("calibration.npz", handle)}).json()["id"]


def test_report_chart_fits_the_tolerance_draws_the_front_zooms_within_the_data_and_tables_fit(stack, new_page, digits_files):
    from playwright.sync_api import expect

    user = new_user(stack, "chart", "Charts")
    # Long names, as real ones are: the tables must still fit.
    agent = scripted_agent(stack, user, "jetson-orin-nano-with-a-rather-long-host-name")
    model = upload_model(stack, user, digits_files, name="resnet-ish-image-classifier-v2")
    job = run_scripted_job(stack, user, agent, model, ANSWERS, {"metric": "top1_agreement", "max_drop": 0.01},
                           calibration=upload_calibration(stack, user, digits_files))

    page = new_page(1366, 900)
    sign_in(page, user)
    page.goto(f"/jobs/{job['id']}/report")
    chart = page.get_by_test_id("latency-accuracy-chart").first
    expect(chart.locator("canvas").first).to_be_visible()
    chart.scroll_into_view_if_needed()
    # The axis is fitted to the variants within reach of the tolerance: the collapsed int4 is off the scale, marked.
    assert float(chart.get_attribute("data-home-y-min")) > 0.9
    assert chart.get_attribute("data-off-scale") == "1"
    expect(page.get_by_test_id("chart-legend").first).to_contain_text("Pareto front")
    expect(page.get_by_test_id("chart-legend").first).to_contain_text("Off the scale")
    expect(page.get_by_test_id("scatter-caption").first).to_contain_text("drawn at the edge with a triangle")
    labels = chart.get_by_test_id("point-label")
    expect(chart.get_by_test_id("point-hit")).to_have_count(4)
    expect(chart.get_by_test_id("point-label").filter(has_text="off the scale")).to_have_count(1)
    # Visible names never overlap one another, and stay inside the plot.
    boxes = [labels.nth(index).bounding_box() for index in range(labels.count())]
    plot = chart.locator(".u-over").bounding_box()
    for index, a in enumerate(boxes):
        assert plot["x"] - 1 <= a["x"] and a["x"] + a["width"] <= plot["x"] + plot["width"] + 1
        for b in boxes[index + 1:]:
            assert a["x"] + a["width"] <= b["x"] or b["x"] + b["width"] <= a["x"] or a["y"] + a["height"] <= b["y"] or b["y"] + b["height"] <= a["y"], (a, b)
    screenshot(page, "27-01-chart-1366")

    # Per layer, under the model's own node names (the runtime's beneath), time beside quantization error.
    layer = page.get_by_test_id("layer-table").first.get_by_test_id("layer-row").first
    expect(layer).to_contain_text("conv1 + relu1")
    expect(layer).to_contain_text("runtime: Multiply_615451")
    page.get_by_test_id("layer-view").first.scroll_into_view_if_needed()
    screenshot(page, "27-08-layers-1366")

    # Every point answers to keyboard focus with its name and numbers.
    chart.get_by_test_id("point-hit").first.focus()
    assert "ms" in page.evaluate("document.activeElement.getAttribute('aria-label')")

    # A box dragged past the top of the plot is cut to the data: the y axis never goes past the home range.
    home_y_max = float(chart.get_attribute("data-home-y-max"))
    page.mouse.move(plot["x"] + plot["width"] * 0.3, plot["y"] + plot["height"] * 0.6)
    page.mouse.down()
    page.mouse.move(plot["x"] + plot["width"] * 0.7, plot["y"] - 60, steps=8)
    page.mouse.up()
    expect(page.get_by_test_id("zoom-reset").first).to_be_enabled()
    assert float(chart.get_attribute("data-y-max")) <= home_y_max + 1e-9
    page.get_by_test_id("zoom-reset").first.click()
    # Zoom in from the keyboard lands on the recommended point, not on an empty middle.
    page.get_by_test_id("zoom-in").first.focus()
    page.keyboard.press("Enter")
    x_min, x_max = float(chart.get_attribute("data-x-min")), float(chart.get_attribute("data-x-max"))
    recommended_p50 = next(v["latency_ms"]["p50"] for v in api(stack, user, "GET", f"jobs/{job['id']}/report/").json()["devices"][0]["variants"]
                           if v["id"] == api(stack, user, "GET", f"jobs/{job['id']}/report/").json()["devices"][0]["recommended"])
    assert x_min <= recommended_p50 <= x_max
    expect(chart.get_by_test_id("point-hit")).not_to_have_count(0)
    # Zoom out never goes past the data either.
    for _ in range(3):
        if page.get_by_test_id("zoom-out").first.is_enabled():
            page.get_by_test_id("zoom-out").first.click()
    assert float(chart.get_attribute("data-y-max")) <= home_y_max + 1e-9
    expect(page.get_by_test_id("zoom-reset").first).to_be_disabled()

    for width in WIDTHS[1:]:
        page.set_viewport_size({"width": width, "height": 900})
        wait_for_page(page, "document.querySelector('.u-over').getBoundingClientRect().right <= window.innerWidth")
        assert no_sideways_scroll(page), f"the report scrolls sideways at {width} px"
        screenshot(page, f"27-01-chart-{width}")

    page.set_viewport_size({"width": 1366, "height": 900})
    expect_tables_fit(page, job["id"], model["id"])


def fully_visible(page, locator) -> bool:
    """Inside the window and not clipped by a scrolling ancestor (a table box scrolled sideways hides columns)."""
    return locator.evaluate("""element => {
        const box = element.getBoundingClientRect();
        if (box.width === 0 || box.right > window.innerWidth + 1 || box.left < -1) return false;
        for (let parent = element.parentElement; parent; parent = parent.parentElement) {
            const style = getComputedStyle(parent);
            if (style.overflowX === 'visible') continue;
            const edge = parent.getBoundingClientRect();
            if (box.right > edge.right + 1 || box.left < edge.left - 1) return false;
        }
        return true;
    }""")


def expect_tables_fit(page, job_id: int, model_id: int) -> None:
    """Download, accuracy, drop and tolerance stay in view without sideways scrolling; on a phone rows become cards;
    every list page fits too."""
    from playwright.sync_api import expect

    page.goto(f"/jobs/{job_id}/report")
    table = page.get_by_test_id("report-table").first
    expect(table).to_be_visible()
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(100)
        assert no_sideways_scroll(page), f"the report page scrolls sideways at {width} px"
        row = table.get_by_test_id("recommended-row")
        for what in ("variant-download",):
            assert fully_visible(page, row.get_by_test_id(what)), f"{what} is cut off at {width} px"
        for header in ("Accuracy", "Drop", "In tolerance"):
            cell = row.locator(f'td[data-label="{header}"]')
            assert fully_visible(page, cell), f"{header} is cut off at {width} px"
        why_not = page.get_by_test_id("why-not").first
        why_not.scroll_into_view_if_needed()
        assert fully_visible(page, why_not.locator("td").last), f"why not is hidden at {width} px"
        screenshot(page, f"27-05-report-{width}")
    # On a phone each variant is a card, each value named by its column; the headers are a line of sort buttons.
    assert table.locator("thead").evaluate("element => element.getBoundingClientRect().right <= window.innerWidth")
    table.get_by_role("button", name=re.compile("^Accuracy")).click()
    expect(table.get_by_role("columnheader", name=re.compile("^Accuracy"))).to_have_attribute("aria-sort", "ascending")
    expect(table.get_by_test_id("recommended-row").locator('td[data-label="Latency p50"]')).to_be_visible()

    # The other list pages fit too: no sideways page scroll at any width.
    for path in ("/deployments", "/datasets", "/models", "/devices", "/performance", f"/models/{model_id}"):
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": 900})
            page.goto(path)
            page.wait_for_load_state("networkidle")
            expect(page.get_by_text("Page not found")).to_have_count(0)
            assert no_sideways_scroll(page), f"{path} scrolls sideways at {width} px"
            tables = page.locator("table")
            for index in range(tables.count()):
                cells = tables.nth(index).locator("tbody tr").first.locator("td")
                for cell in range(cells.count()):
                    if cells.nth(cell).is_visible():
                        assert fully_visible(page, cells.nth(cell)), f"{path}: a column of table {index} is cut off at {width} px"
            screenshot(page, f"27-05{path.replace('/', '-')}-{width}")


def test_defaults_that_do_not_mislead(stack, new_page, digits_files, tmp_path):
    """A toy model does not answer "which device should I buy?", a job is compared with one of its own model,
    byte-identical uploads are one model, the model page shows the measurement beside the estimate,
    /deployments/N opens job N, and the CSV carries the job id."""
    import onnx
    from playwright.sync_api import expect

    from tests.fixtures.models import build_transformer_like

    user = new_user(stack, "defaults", "Defaults")
    agent = scripted_agent(stack, user, "orin-nano")
    toy_path = tmp_path / "toy.onnx"
    onnx.save(build_transformer_like(), str(toy_path))
    with open(toy_path, "rb") as handle:
        toy = api(stack, user, "POST", "models/", data={"name": "toy-test-model"}, files={"file": ("toy.onnx", handle)}).json()
    run_scripted_job(stack, user, agent, toy, {"fp32": (0.009, 1.0)}, {"metric": "top1_agreement", "max_drop": 0.01})
    digits = upload_model(stack, user, digits_files, name="digits")
    copy = upload_model(stack, user, digits_files, name="digits-copy")
    first = run_scripted_job(stack, user, agent, digits, {"fp32": (40.0, 1.0)}, {"metric": "top1_agreement", "max_drop": 0.01})
    second = run_scripted_job(stack, user, agent, copy, {"fp32": (42.0, 1.0)}, {"metric": "top1_agreement", "max_drop": 0.01})

    page = new_page(1366, 900)
    sign_in(page, user)
    page.goto("/performance")
    expect(page.get_by_test_id("device-chart-caption")).to_contain_text("digits")
    expect(page.get_by_test_id("device-chart")).to_contain_text("40 ms")
    expect(page.get_by_test_id("device-chart")).not_to_contain_text("0.009")
    expect(page.get_by_test_id("compare-job")).to_have_value(str(second["id"]))
    expect(page.get_by_test_id("compare-earlier")).to_have_value(str(first["id"]))
    expect(page.get_by_test_id("job-comparison")).to_contain_text("1.05x")
    screenshot(page, "27-07-performance-1366")

    page.goto(f"/compare?a={first['id']}&b={second['id']}")
    expect(page.get_by_test_id("compare-ground")).to_contain_text("Same model (digits and digits-copy are byte-identical uploads)")

    page.goto(f"/models/{digits['id']}")
    expect(page.get_by_test_id("parameter-count")).to_have_text("6,090")
    estimate = page.get_by_test_id("latency-estimate")
    # The newest FP32 measurement of these bytes: the copy's job ran last.
    expect(estimate.get_by_test_id("estimate-measured").first).to_have_text("42 ms")
    screenshot(page, "27-07-model-1366")

    page.goto(f"/deployments/{first['id']}")
    expect(page).to_have_url(re.compile(rf"/jobs/{first['id']}$"))
    page.goto("/jobs")
    expect(page).to_have_url(re.compile(r"/deployments$"))
    page.goto(f"/deployments/{first['id']}/report")
    expect(page).to_have_url(re.compile(rf"/jobs/{first['id']}/report$"))
    with page.expect_download() as download:
        page.get_by_role("button", name=re.compile("Export CSV")).first.click()
    assert download.value.suggested_filename == f"kiln-report-job-{first['id']}-orin-nano.csv"


def test_tolerance_is_a_percentage_checked_at_the_field(stack, new_page, digits_files):
    from playwright.sync_api import expect

    user = new_user(stack, "percent", "Percent")
    upload_model(stack, user, digits_files, name="digits")
    for width in WIDTHS:
        page = new_page(width, 900)
        sign_in(page, user)
        page.goto("/deployments/new")
        page.get_by_label("Model", exact=True).select_option(label="digits")
        field = page.get_by_test_id("max-drop-input")
        field.scroll_into_view_if_needed()
        expect(field).to_have_value("1")
        # Issue 37: "0.01 points" read ambiguously; auto names what it reads for this model, in points of its 0–100% scale.
        expect(page.get_by_test_id("max-drop-meaning")).to_contain_text("1% = 1 point of top-1 agreement: with FP32 at 100%, a variant at 99% still passes.")
        # "1%" typed as such is one percent, not 1 (which once let everything pass).
        field.fill("1%")
        expect(page.get_by_test_id("max-drop-meaning")).to_contain_text("1% = 1 point of top-1 agreement")
        # 200% is refused at the field, as it is typed, in the user's terms.
        field.fill("200%")
        expect(page.locator("#maxDrop-error")).to_have_text("200% is more than the whole scale: at most 100%.")
        expect(field).to_have_attribute("aria-invalid", "true")
        page.get_by_test_id("metric-select").select_option("cosine")
        field.fill("0.05")
        expect(page.get_by_test_id("max-drop-warning")).to_contain_text("the field is in percent")
        field.fill("0.5")
        expect(page.get_by_test_id("max-drop-meaning")).to_contain_text("0.5% = 0.005 of cosine similarity")
        assert no_sideways_scroll(page)
        screenshot(page, f"27-02-tolerance-{width}")
    # What the form sends is the fraction the API takes.
    with page.expect_request(lambda request: request.url.endswith("/api/v1/jobs/") and request.method == "POST") as sent:
        page.get_by_test_id("start-deployment").click()
    assert sent.value.post_data_json["tolerance"] == {"metric": "cosine", "max_drop": 0.005}


def test_devices_page_names_the_address_devices_reach_and_installs_from_this_server(stack, new_page):
    from playwright.sync_api import expect

    user = new_user(stack, "devices", "Devices")
    for width in WIDTHS:
        page = new_page(width, 900)
        sign_in(page, user)
        page.goto("/devices")
        # The live server listens on a loopback address: the page says that a device cannot use it.
        warning = page.get_by_test_id("loopback-warning")
        expect(warning).to_contain_text("will not work from a device")
        page.get_by_test_id("registration-token-name").fill(f"lab-{width}")
        page.get_by_role("button", name="Create registration token").click()
        expect(page.get_by_test_id("install-command")).to_have_text(f"pip install --find-links {stack.url}/downloads/ kiln-agent onnxruntime")
        expect(page.get_by_test_id("runtime-choices")).to_contain_text("openvino")
        expect(page.get_by_test_id("setup-steps")).not_to_contain_text("TensorRT")
        # Typing the address the devices use rewrites every command; the warning goes.
        page.get_by_test_id("server-address-input").fill("http://192.168.1.20:8000")
        expect(warning).to_have_count(0)
        expect(page.get_by_test_id("install-command")).to_have_text("pip install --find-links http://192.168.1.20:8000/downloads/ kiln-agent onnxruntime")
        expect(page.get_by_test_id("up-command")).to_contain_text("kiln-agent up --server http://192.168.1.20:8000 --registration-token kiln_reg_")
        assert no_sideways_scroll(page)
        screenshot(page, f"27-04-devices-{width}")


def test_a_folder_of_jpegs_becomes_a_dataset_with_a_proposed_recipe_and_a_preview(stack, new_page, digits_files, tmp_path):
    """No NumPy: choose the model, Kiln proposes the recipe; choose the folder, the page shows what each photo becomes and
    whether it fits the model before anything is uploaded; then upload."""
    from playwright.sync_api import expect

    from tests.e2e.test_cli_commands import jpeg_folder

    user = new_user(stack, "photos", "Photos")
    model = upload_model(stack, user, digits_files, name="digits")
    photos = jpeg_folder(tmp_path / "scans")
    # From the model's page, "Add data for it" opens the Datasets page with the model chosen and its recipe proposed.
    page = new_page(1366, 900)
    sign_in(page, user)
    page.goto(f"/models/{model['id']}")
    page.get_by_test_id("add-data-for-model").click()
    expect(page.get_by_test_id("recipe-model-select")).to_have_value(str(model["id"]))
    expect(page.get_by_test_id("recipe-why")).to_contain_text("NCHW, 1 channel")
    for width in WIDTHS:
        page = new_page(width, 900)
        sign_in(page, user)
        page.goto("/datasets")
        # A folder chosen before any recipe: the page says what to do, in place (not "numpy.savez").
        page.get_by_test_id("dataset-upload-folder-input").set_input_files(str(photos))
        expect(page.get_by_test_id("dataset-upload-prepare-error")).to_contain_text("choose the model they feed")
        page.get_by_test_id("recipe-model-select").select_option(label="digits")
        expect(page.get_by_test_id("recipe-why")).to_contain_text("NCHW, 1 channel")
        expect(page.get_by_test_id("dataset-recipe-input")).to_have_value(re.compile(r'"input": "input"'))
        page.get_by_test_id("dataset-kind-select").select_option("validation")
        page.get_by_test_id("dataset-name-input").fill(f"scans-{width}")
        page.get_by_test_id("dataset-upload-folder-input").set_input_files(str(photos))
        preview = page.get_by_test_id("raw-preview")
        expect(preview).to_contain_text("6 files")
        expect(preview.get_by_test_id("raw-preview-tensors")).to_contain_text("float32 [1, 8, 8]")
        # Issue 37: every class with its count, not the classes of the first few files.
        expect(preview.get_by_test_id("raw-preview-classes")).to_have_text("Labels from the class folders: 2 classes: seven 3, three 3.")
        expect(preview.get_by_test_id("raw-preview-fits")).to_contain_text("Fits digits")
        wait_for_page(page, "() => [...document.querySelectorAll('[data-testid=raw-preview-samples] img')].every(i => i.complete && i.naturalWidth > 0)")
        assert no_sideways_scroll(page)
        screenshot(page, f"27-03-preview-{width}")
        if width != WIDTHS[0]:
            page.get_by_test_id("raw-preview-cancel").click()
            expect(preview).to_have_count(0)
            continue
        page.get_by_test_id("raw-preview-upload").click()
        row = page.get_by_test_id("dataset-row").filter(has_text=f"scans-{width}")
        expect(row).to_be_visible(timeout=60_000)
        expect(row.get_by_test_id("dataset-samples")).to_have_text("6")
        screenshot(page, f"27-03-uploaded-{width}")
    # A recipe edited to a size the model does not take is flagged before the upload, and the upload is held back.
    edited = page.get_by_test_id("dataset-recipe-input").input_value().replace('"size": [8,8]', '"size": [16,16]')
    assert '"size": [16,16]' in edited
    page.get_by_test_id("dataset-recipe-input").fill(edited)
    page.get_by_test_id("dataset-upload-folder-input").set_input_files(str(photos))
    expect(page.get_by_test_id("raw-preview-misfit")).to_contain_text("16 where it needs 8")
    expect(page.get_by_test_id("raw-preview-upload")).to_be_disabled()
    assert len(api(stack, user, "GET", "datasets/").json()["results"]) == 1
