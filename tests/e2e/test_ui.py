"""Browser tests of the web UI against a live Kiln: real server, Celery worker, agent and Chromium.

They drive Debian's Chromium through its executable path (no browser download) with Python
Playwright. By default they use the `kiln_stack` fixture from tests/conftest.py. To point them
at a server that is already running instead (with its own worker), set KILN_E2E_URL, e.g.
`KILN_E2E_URL=http://127.0.0.1:8000 pytest tests/e2e/test_ui.py`; users are then created
through the sign-up API and an agent is started with the `devices.agent` CLI.

Screenshots of the main pages land in test-artifacts/screenshots/.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
FRONTEND = REPO / "frontend"
SCREENSHOTS = REPO / "test-artifacts" / "screenshots"
CHROMIUM = os.environ.get("KILN_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
EXTERNAL_URL = os.environ.get("KILN_E2E_URL", "").rstrip("/")
PASSWORD = "kiln-e2e-Password-1"
# A deployment on one CPU agent with fp32 + int8 takes well under a minute; the margin is for a busy machine.
JOB_TIMEOUT_MS = 300_000


# -- stack -----------------------------------------------------------------------------------

@dataclass
class User:
    """A signed-up user, with an API token for setting up data without the browser."""

    username: str
    password: str
    organization: str
    token: str
    tenant: object = None


@dataclass
class ExternalStack:
    """The kiln_stack interface against a server that is already running (KILN_E2E_URL)."""

    url: str
    work_dir: Path
    processes: list = field(default_factory=list)

    def create_user(self, username: str, password: str, organization: str):
        import requests

        session = requests.Session()
        session.get(f"{self.url}/api/v1/auth/csrf/", timeout=10).raise_for_status()
        headers = {"X-CSRFToken": session.cookies["csrftoken"], "Referer": self.url + "/"}
        response = session.post(f"{self.url}/api/v1/auth/signup/", json={"username": username, "password": password,
                                "organization": organization}, headers=headers, timeout=10)
        assert response.status_code == 201, response.text
        headers["X-CSRFToken"] = session.cookies["csrftoken"]
        response = session.post(f"{self.url}/api/v1/tokens/", json={"name": "e2e", "expires_in_days": 1},
                                headers=headers, timeout=10)
        assert response.status_code == 201, response.text
        registration = session.post(f"{self.url}/api/v1/agents/registration-tokens/", json={"name": "e2e"},
                                    headers=headers, timeout=10)
        assert registration.status_code == 201, registration.text
        user = User(username, password, organization, response.json()["token"])
        user.registration_token = registration.json()["token"]
        return user

    def start_agent(self, user, name: str):
        config = self.work_dir / f"agent-{name}.json"
        env = {**os.environ, "KILN_AGENT_CONFIG": str(config), "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'platform'}"}
        subprocess.run([sys.executable, "-m", "devices.agent", "register", "--server", self.url, "--registration-token",
                        user.registration_token, "--name", name], env=env, cwd=REPO, check=True, capture_output=True,
                       timeout=60)
        log = open(self.work_dir / f"agent-{name}.log", "ab")
        process = subprocess.Popen([sys.executable, "-m", "devices.agent", "run", "--work-dir", str(self.work_dir / name)],
                                   env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append(process)
        return process

    def logs(self) -> str:
        return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-4000:]}" for path in self.work_dir.glob("*.log"))

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture(scope="session")
def ui_dist():
    """The built UI. Building is a no-op when nothing changed; it must happen before the live server starts."""
    result = subprocess.run([str(FRONTEND / "build.sh")], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"frontend/build.sh failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    if not EXTERNAL_URL:
        from django.conf import settings

        # Settings picked WHITENOISE_ROOT at import; a first build in this run would be missed.
        if getattr(settings, "WHITENOISE_ROOT", None) is None:
            settings.WHITENOISE_ROOT = FRONTEND / "dist"
    return FRONTEND / "dist"


if EXTERNAL_URL:
    @pytest.fixture
    def stack(ui_dist, tmp_path):
        external = ExternalStack(url=EXTERNAL_URL, work_dir=tmp_path)
        yield external
        external.stop()
else:
    # kiln_stack must be a static dependency: pytest-django sets up the test database only then
    # (a getfixturevalue("kiln_stack") would query the development database).
    @pytest.fixture
    def stack(ui_dist, kiln_stack):
        _check_ui_is_served(kiln_stack.url)
        return kiln_stack


def _check_ui_is_served(url: str) -> None:
    import requests

    index = requests.get(url + "/models", timeout=10)
    assert index.status_code == 200, f"GET /models answered {index.status_code}"
    scripts = re.findall(r'src="(/assets/[^"]+\.js)"', index.text)
    assert scripts, "the server does not serve the built UI's index.html at / (run frontend/build.sh)"
    asset = requests.get(url + scripts[0], timeout=10)
    assert asset.status_code == 200, f"the server does not serve {scripts[0]} ({asset.status_code}); is WHITENOISE_ROOT set?"


def new_user(stack, prefix: str, organization: str) -> User:
    """A fresh user in a fresh organization, with an API token for the setup the browser does not cover."""
    username = f"{prefix}-{uuid.uuid4().hex[:6]}"
    created = stack.create_user(username, PASSWORD, f"{organization} {uuid.uuid4().hex[:4]}")
    if isinstance(created, User):
        return created
    # tests/conftest.py's Tenant: user, organization, token, client.
    return User(username, PASSWORD, created.organization.name, created.token, tenant=created)


def start_agent(stack, user: User, name: str):
    return stack.start_agent(user.tenant if user.tenant is not None else user, name)


def api(stack, user: User, method: str, path: str, **kwargs):
    import requests

    return requests.request(method, f"{stack.url}/api/v1/{path}", headers={"Authorization": f"Bearer {user.token}"},
                            timeout=60, **kwargs)


# -- browser ---------------------------------------------------------------------------------

# Module scope: Playwright's sync API marks an event loop running on this thread until it stops,
# and Django's async views (the agent lease) refuse to run under the test client while it is.
@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"Chromium not found at {CHROMIUM}; apt-get install -y chromium (or set KILN_CHROMIUM)")
    # Playwright's sync API keeps an event loop on this thread; Django then refuses ORM calls from
    # it (SynchronousOnlyOperation) although nothing here is actually async.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    playwright = sync_playwright().start()
    chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
    yield chromium
    chromium.close()
    playwright.stop()


@pytest.fixture
def new_page(browser, stack):
    """Opens pages in fresh browser contexts (separate cookies), at laptop size, closed after the test."""
    contexts = []
    csp_violations = []

    def record_violation(message) -> None:
        if "Content Security Policy" in message.text:
            csp_violations.append(message.text)

    def open_page(width: int = 1280, height: int = 800):
        context = browser.new_context(base_url=stack.url, viewport={"width": width, "height": height}, accept_downloads=True)
        context.set_default_timeout(15_000)
        contexts.append(context)
        page = context.new_page()
        page.on("console", record_violation)
        return page

    yield open_page
    for context in contexts:
        context.close()
    # The UI runs under the server's strict Content-Security-Policy; anything it blocked is a bug.
    assert not csp_violations, csp_violations


def expect_named_points(page, names: list[str]) -> None:
    """Every point of the first report scatter carries its variant's name, and no two names overlap."""
    from playwright.sync_api import expect

    labels = page.get_by_test_id("latency-accuracy-chart").first.get_by_test_id("point-label")
    expect(labels).to_have_count(len(names))
    assert sorted(labels.all_inner_texts()) == sorted(names)
    boxes = [labels.nth(index).bounding_box() for index in range(len(names))]
    plot = page.get_by_test_id("latency-accuracy-chart").first.locator(".u-over").bounding_box()
    for index, a in enumerate(boxes):
        assert a is not None and a["width"] > 0
        inside = plot["x"] - 1 <= a["x"] and a["x"] + a["width"] <= plot["x"] + plot["width"] + 1 and plot["y"] - 1 <= a["y"] and a["y"] + a["height"] <= plot["y"] + plot["height"] + 1
        assert inside, f"point label outside the plot: {a} {plot}"
        for b in boxes[index + 1:]:
            apart = a["x"] + a["width"] <= b["x"] or b["x"] + b["width"] <= a["x"] or a["y"] + a["height"] <= b["y"] or b["y"] + b["height"] <= a["y"]
            assert apart, f"point labels overlap: {a} {b}"


def expect_zoom_changes_the_axis_range(page) -> None:
    """Drag a box to zoom in, double-click to zoom out; the keyboard's Zoom in and Reset zoom do the same."""
    from playwright.sync_api import expect

    chart = page.get_by_test_id("latency-accuracy-chart").first
    chart.scroll_into_view_if_needed()

    def x_width() -> float:
        return float(chart.get_attribute("data-x-max")) - float(chart.get_attribute("data-x-min"))

    home = x_width()
    plot = chart.locator(".u-over").bounding_box()
    page.mouse.move(plot["x"] + plot["width"] * 0.2, plot["y"] + plot["height"] * 0.1)
    page.mouse.down()
    page.mouse.move(plot["x"] + plot["width"] * 0.5, plot["y"] + plot["height"] * 0.9, steps=8)
    page.mouse.up()
    expect(page.get_by_test_id("zoom-reset").first).to_be_enabled()
    assert x_width() == pytest.approx(home * 0.3, rel=0.1), (home, x_width())
    screenshot(page, "16b-report-chart-zoomed")
    page.mouse.dblclick(plot["x"] + plot["width"] * 0.5, plot["y"] + plot["height"] * 0.5)
    expect(page.get_by_test_id("zoom-reset").first).to_be_disabled()
    assert x_width() == pytest.approx(home)
    page.get_by_test_id("zoom-in").first.focus()
    page.keyboard.press("Enter")
    assert x_width() == pytest.approx(home / 2)
    page.get_by_test_id("zoom-reset").first.focus()
    page.keyboard.press("Enter")
    assert x_width() == pytest.approx(home)


def wait_for_page(page, expression: str, timeout_ms: float = 30_000) -> None:
    """Wait until `expression` is true in the page. Polled from here with page.evaluate (run over the DevTools protocol):
    Playwright's own wait_for_function re-evaluates its predicate inside the page with eval, which Kiln's
    Content-Security-Policy (script-src 'self') rightly refuses."""
    deadline = time.monotonic() + timeout_ms / 1000
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {timeout_ms / 1000:.0f} s: {expression}")
        time.sleep(0.1)


def screenshot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def sign_in(page, user: User) -> None:
    from playwright.sync_api import expect

    page.goto("/models")
    expect(page).to_have_url(re.compile(r"/login"))
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill(user.password)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Models", level=1)).to_be_visible()
    expect(page.get_by_test_id("current-user")).to_contain_text(user.username)


def select_containing(select, text: str) -> None:
    """Chooses the option whose label contains `text` (labels carry counts the test need not know)."""
    value = select.locator("option", has_text=text).first.get_attribute("value")
    select.select_option(value=value)


# -- data --------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def digits_files(tmp_path_factory):
    import onnx

    from tests.fixtures.models import train_digits_cnn, write_npz

    digits = train_digits_cnn()
    root = tmp_path_factory.mktemp("ui-digits")
    model = root / "digits.onnx"
    onnx.save(digits.model, str(model))
    return {
        "model": model,
        "calibration": write_npz(root / "digits-calibration.npz", input=digits.x_calib),
        "validation": write_npz(root / "digits-validation.npz", input=digits.x_val, labels=digits.y_val),
        "samples": {"calibration": len(digits.x_calib), "validation": len(digits.x_val)},
    }


# -- tests -------------------------------------------------------------------------------------

def test_upload_deploy_watch_report_and_download(stack, new_page, digits_files, tmp_path):
    from playwright.sync_api import expect

    user = new_user(stack, "ada", "Analytical Engines")
    start_agent(stack, user, "e2e-cpu")
    page = new_page()

    sign_in(page, user)
    expect(page.get_by_text("No models yet.")).to_be_visible()
    screenshot(page, "01-models-empty")

    # Upload through the file picker; the signature appears on the model page.
    page.get_by_test_id("model-name-input").fill("digits")
    page.get_by_test_id("model-upload-input").set_input_files(str(digits_files["model"]))
    item = page.get_by_test_id("upload-item").first
    expect(item).to_have_attribute("data-status", "done", timeout=60_000)
    expect(page.get_by_test_id("model-row")).to_have_count(1)
    screenshot(page, "02-models-list")
    item.get_by_role("link", name="Open digits").click()
    expect(page.get_by_role("heading", name="digits", level=1)).to_be_visible()
    inputs = page.get_by_test_id("signature-inputs")
    expect(inputs).to_contain_text("input")
    expect(inputs).to_contain_text("float32")
    expect(inputs).to_contain_text("[batch, 1, 8, 8]")
    expect(page.get_by_test_id("signature-outputs")).to_contain_text("10]")
    expect(page.get_by_test_id("validation-result")).to_contain_text("Valid")
    expect(page.get_by_test_id("op-histogram")).to_contain_text("Conv")
    # How the output is judged: inferred from the graph, overridable, and back to the inferred kind.
    kinds = page.get_by_test_id("output-kinds")
    expect(kinds).to_contain_text("Gemm logits")
    kind_select = kinds.get_by_label("Kind of logits")
    expect(kind_select).to_have_value("class_scores")
    kind_select.select_option("embedding")
    expect(kinds).to_contain_text("set by you; Kiln inferred Class scores")
    page.reload()
    expect(page.get_by_test_id("output-kinds").get_by_label("Kind of logits")).to_have_value("embedding")
    page.get_by_test_id("output-kinds").get_by_role("button", name="Use inferred").click()
    expect(page.get_by_test_id("output-kinds").get_by_label("Kind of logits")).to_have_value("class_scores")
    screenshot(page, "03-model-detail")

    # Calibration and validation datasets.
    page.get_by_role("link", name="Datasets").click()
    expect(page.get_by_text("No datasets yet.")).to_be_visible()
    for kind in ("calibration", "validation"):
        page.get_by_label("Kind").select_option(kind)
        page.get_by_test_id("dataset-name-input").fill(f"digits-{kind}")
        page.get_by_test_id("dataset-upload-input").set_input_files(str(digits_files[kind]))
        expect(page.get_by_test_id("upload-item").first).to_have_attribute("data-status", "done", timeout=60_000)
        row = page.get_by_test_id("dataset-row").filter(has_text=f"digits-{kind}")
        expect(row).to_be_visible()
        expect(row.get_by_test_id("dataset-samples")).to_have_text(str(digits_files["samples"][kind]))
    expect(page.get_by_test_id("datasets-table")).to_contain_text("input")
    screenshot(page, "04-datasets")

    # The agent shows up online on the devices page.
    page.get_by_role("link", name="Devices").click()
    agent_row = page.get_by_test_id("agent-row").filter(has_text="e2e-cpu")
    expect(agent_row).to_contain_text("Online", timeout=60_000)
    screenshot(page, "05-devices")

    # New deployment, with the client-side check first: int8 without calibration is refused.
    page.get_by_role("link", name="Deployments").click()
    page.get_by_test_id("new-deployment").click()
    page.get_by_label("Model", exact=True).select_option(label="digits")
    expect(page.get_by_label("Version", exact=True)).to_have_value(re.compile(r"\d+"))
    page.get_by_test_id("precision-explicit").check()
    page.get_by_test_id("precision-fp32").check()
    page.get_by_test_id("precision-int8").check()
    # The only calibration set that fits is chosen for the user (issue 37); without it, int8 is refused.
    expect(page.get_by_label("Calibration dataset", exact=True).locator("option:checked")).to_contain_text("digits-calibration")
    page.get_by_label("Calibration dataset", exact=True).select_option("")
    page.get_by_test_id("start-deployment").click()
    expect(page.get_by_test_id("form-errors")).to_contain_text("needs a calibration dataset")
    select_containing(page.get_by_label("Calibration dataset", exact=True), "digits-calibration")
    select_containing(page.get_by_label("Validation dataset", exact=True), "digits-validation")
    expect(page.get_by_test_id("device-choices")).to_contain_text("e2e-cpu")
    # Declare the logits as primary, judged by top-1 accuracy against the validation labels.
    expect(page.get_by_test_id("output-kind-summary")).to_contain_text("logits: Class scores")
    page.get_by_test_id("add-metric").click()
    page.get_by_label("Metric kind").select_option("accuracy")
    screenshot(page, "06-new-deployment")
    page.get_by_test_id("start-deployment").click()

    # The job page updates live until the job is done.
    expect(page).to_have_url(re.compile(r"/jobs/\d+$"))
    expect(page.get_by_test_id("stage-timeline")).to_be_visible()
    screenshot(page, "07-job-running")
    status = page.get_by_test_id("job-status")
    expect(status).to_have_attribute("data-status", re.compile("succeeded|failed|canceled"), timeout=JOB_TIMEOUT_MS)
    final = status.get_attribute("data-status")
    if final != "succeeded":
        screenshot(page, "07-job-failed")
        events = page.get_by_test_id("event-log").inner_text() if page.get_by_test_id("event-log").count() else ""
        pytest.fail(f"job ended {final}\n{events}\n{stack.logs() if hasattr(stack, 'logs') else ''}")
    expect(page.get_by_test_id("stage-validate")).to_have_attribute("data-status", "done")
    expect(page.get_by_test_id("device-task-row").first).to_contain_text("Succeeded")
    expect(page.get_by_test_id("event-log")).to_be_visible()
    # Every measuring task's compiled engine is listed once the job has ended (no stale list); the finalists' re-timing
    # builds nothing and says what it is rather than naming one variant.
    task_count = page.locator('[data-testid="device-task-row"][data-purpose="measure"]').count()
    retimes = page.locator('[data-testid="device-task-row"][data-purpose="retime"]')
    assert all("re-timed side by side" in text for text in retimes.all_inner_texts())
    expect(page.locator('[data-testid="artifact-row"][data-kind="compiled"]')).to_have_count(task_count, timeout=15_000)
    screenshot(page, "08-job-done")

    # Download an artifact through its plain link.
    download_link = page.get_by_test_id("artifact-download").first
    expect(download_link).to_be_visible(timeout=30_000)
    with page.expect_download() as download_info:
        download_link.click()
    download = download_info.value
    target = tmp_path / (download.suggested_filename or "artifact.bin")
    download.save_as(str(target))
    assert target.stat().st_size > 0
    assert download.failure() is None

    # The report: the table with the recommended variant and the charts.
    page.get_by_test_id("open-report").click()
    expect(page).to_have_url(re.compile(r"/jobs/\d+/report$"))
    table = page.get_by_test_id("report-table").first
    expect(table).to_be_visible()
    expect(table).to_contain_text("fp32")
    expect(table).to_contain_text("int8")
    expect(page.get_by_test_id("recommended-row").first).to_contain_text("Recommended")
    expect(page.get_by_test_id("recommendation").first).to_be_visible()
    expect(page.get_by_test_id("outputs-judged")).to_contain_text("logits as Class scores (primary)")
    expect(page.get_by_test_id("fp32-noise").first).to_contain_text("onnxruntime top1_accuracy")
    # The deployment package of the recommended variant downloads from the report.
    with page.expect_download() as package_info:
        page.get_by_test_id("package-download").first.click()
    package = tmp_path / "package.zip"
    package_info.value.save_as(str(package))
    import zipfile

    with zipfile.ZipFile(package) as archive:
        assert {"model.onnx", "report.json", "run.py", "README.md"} <= set(archive.namelist())
    expect(page.get_by_test_id("latency-accuracy-chart").first.locator("canvas").first).to_be_visible()
    # Sorting by a column changes aria-sort.
    table.get_by_role("button", name=re.compile("^Size")).click()
    expect(table.get_by_role("columnheader", name=re.compile("^Size"))).to_have_attribute("aria-sort", "ascending")
    screenshot(page, "09-report")

    # Laptop width still shows the report without horizontal page scroll.
    page.set_viewport_size({"width": 1024, "height": 700})
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    screenshot(page, "10-report-laptop")


def test_invalid_model_upload_shows_the_server_error(stack, new_page, tmp_path):
    from playwright.sync_api import expect

    user = new_user(stack, "bob", "Builders")
    bad = tmp_path / "bad.onnx"
    bad.write_text("this is a text file, not an ONNX protobuf\n")
    # What the server says about this file, asked directly, is what the UI must show.
    with open(bad, "rb") as handle:
        answer = api(stack, user, "POST", "models/", data={"name": "bad"}, files={"file": ("bad.onnx", handle)})
    assert 400 <= answer.status_code < 500, answer.text
    server_message = answer.json()["error"]

    page = new_page()
    sign_in(page, user)
    page.get_by_test_id("model-upload-input").set_input_files(str(bad))
    item = page.get_by_test_id("upload-item").filter(has_text="bad.onnx")
    expect(item).to_have_attribute("data-status", "error", timeout=30_000)
    # The server names its temporary file in the message, which differs per upload.
    temporary_name = re.compile(r"tmp\w+\.upload")
    pattern = re.escape(temporary_name.sub("TMP", server_message)).replace("TMP", temporary_name.pattern)
    expect(item.get_by_test_id("upload-error")).to_have_text(re.compile(f"^{pattern}$"))
    expect(page.get_by_text("No models yet.")).to_be_visible()
    screenshot(page, "11-upload-error")


def test_other_organization_does_not_see_models(stack, new_page, digits_files):
    from playwright.sync_api import expect

    owner = new_user(stack, "carol", "First Org")
    outsider = new_user(stack, "dave", "Second Org")
    with open(digits_files["model"], "rb") as handle:
        created = api(stack, owner, "POST", "models/", data={"name": "private-digits"}, files={"file": ("digits.onnx", handle)})
    assert created.status_code == 201, created.text
    model_id = created.json()["id"]

    owner_page = new_page()
    sign_in(owner_page, owner)
    expect(owner_page.get_by_test_id("model-row").filter(has_text="private-digits")).to_be_visible()

    outsider_page = new_page()
    sign_in(outsider_page, outsider)
    expect(outsider_page.get_by_text("No models yet.")).to_be_visible()
    expect(outsider_page.get_by_text("private-digits")).to_have_count(0)
    outsider_page.get_by_test_id("model-search").fill("private")
    expect(outsider_page.get_by_text("No model matches")).to_be_visible()
    outsider_page.goto(f"/models/{model_id}")
    expect(outsider_page.get_by_role("alert")).to_be_visible()
    expect(outsider_page.get_by_text("private-digits")).to_have_count(0)
    screenshot(outsider_page, "12-other-organization")


def test_tokens_registration_command_and_sign_out(stack, new_page):
    from playwright.sync_api import expect

    user = new_user(stack, "erin", "Tokens")
    page = new_page()
    sign_in(page, user)

    page.get_by_role("link", name="API tokens").click()
    page.get_by_test_id("token-name").fill("ci-pipeline")
    page.get_by_test_id("token-expiry").select_option("7")
    page.get_by_role("button", name="Create token").click()
    secret = page.get_by_test_id("token-secret")
    expect(secret).to_contain_text("kiln_pat_")
    expect(secret.get_by_role("button", name="Copy")).to_be_visible()
    row = page.get_by_test_id("token-row").filter(has_text="ci-pipeline")
    expect(row).to_contain_text("Active")
    screenshot(page, "13-api-tokens")
    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Revoke token ci-pipeline").click()
    expect(row).to_contain_text("Revoked")
    # The secret is shown once: a reload does not bring it back.
    page.reload()
    expect(page.get_by_test_id("token-secret")).to_have_count(0)

    page.get_by_role("link", name="Devices").click()
    page.get_by_test_id("registration-token-name").fill("lab")
    page.get_by_role("button", name="Create registration token").click()
    command = page.get_by_test_id("register-command")
    expect(command).to_contain_text("kiln-agent register")
    expect(command).to_contain_text("kiln_reg_")
    screenshot(page, "14-register-device")

    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(re.compile(r"/login"))
    page.goto("/datasets")
    expect(page).to_have_url(re.compile(r"/login\?next=%2Fdatasets"))


def test_owner_adds_a_viewer_who_switches_organization(stack, new_page, digits_files):
    from playwright.sync_api import expect

    # Organizations are listed by name and the first is current at sign-in: the viewer's own
    # ("Bakers …") comes before the one they join ("Millers …"), so the switch is a real one.
    owner = new_user(stack, "fay", "Millers")
    guest = new_user(stack, "gus", "Bakers")
    with open(digits_files["model"], "rb") as handle:
        created = api(stack, owner, "POST", "models/", data={"name": "millers-digits"}, files={"file": ("digits.onnx", handle)})
    assert created.status_code == 201, created.text

    # The owner adds the other user as a viewer on the Members page.
    owner_page = new_page()
    sign_in(owner_page, owner)
    owner_page.get_by_role("link", name="Members").click()
    expect(owner_page.get_by_role("heading", name="Members", level=1)).to_be_visible()
    expect(owner_page.get_by_test_id("member-row")).to_have_count(1)
    form = owner_page.get_by_role("form", name="Add member")
    form.get_by_label("Username").fill(guest.username)
    form.get_by_label("Role").select_option("viewer")
    form.get_by_role("button", name="Add member").click()
    expect(owner_page.get_by_test_id("member-added")).to_contain_text(f"Added {guest.username} as viewer")
    row = owner_page.get_by_test_id("member-row").filter(has_text=guest.username)
    expect(row.get_by_label(f"Role of {guest.username}")).to_have_value("viewer")
    expect(row.get_by_role("button", name=f"Remove {guest.username}")).to_be_visible()
    expect(owner_page.get_by_role("alert")).to_have_count(0)
    screenshot(owner_page, "15-members")

    # The new viewer signs in to their own organization, then switches to the owner's.
    guest_page = new_page()
    sign_in(guest_page, guest)
    expect(guest_page.get_by_text("No models yet.")).to_be_visible()
    expect(guest_page.get_by_test_id("viewer-notice")).to_have_count(0)
    select_containing(guest_page.get_by_test_id("org-switcher"), owner.organization)
    expect(guest_page).to_have_url(re.compile(r"/models$"))
    expect(guest_page.get_by_test_id("org-switcher").locator("option:checked")).to_have_text(f"{owner.organization} (viewer)")
    expect(guest_page.get_by_test_id("model-row").filter(has_text="millers-digits")).to_be_visible()
    notice = guest_page.get_by_test_id("viewer-notice")
    expect(notice).to_contain_text(f"You are a viewer in {owner.organization}")

    # On the Members page the viewer sees the list, read-only.
    guest_page.get_by_role("link", name="Members").click()
    expect(guest_page.get_by_test_id("members-read-only")).to_contain_text("Only owners change members.")
    expect(guest_page.get_by_test_id("member-row")).to_have_count(2)
    expect(guest_page.get_by_role("form", name="Add member")).to_have_count(0)
    expect(guest_page.get_by_role("button", name=re.compile("^Remove"))).to_have_count(0)


def test_live_job_rerun_performance_page_and_estimate(stack, new_page, digits_files, tmp_path):
    """Job pages update over server-sent events; a re-run from the UI; the performance database page; an estimate."""
    import onnx
    from playwright.sync_api import expect

    from tests.fixtures.models import build_transformer_like

    user = new_user(stack, "perf", "Benchmarks")
    start_agent(stack, user, "perf-box")
    with open(digits_files["model"], "rb") as handle:
        model = api(stack, user, "POST", "models/", data={"name": "digits"}, files={"file": ("digits.onnx", handle)}).json()
    page = new_page()
    sign_in(page, user)
    # Wait for the agent before starting, so the job goes straight to the device.
    page.get_by_role("link", name="Devices").click()
    expect(page.get_by_test_id("agent-row").filter(has_text="perf-box")).to_contain_text("Online", timeout=60_000)
    job = api(stack, user, "POST", "jobs/", json={"model_version": model["versions"][0]["id"], "precisions": ["fp32"]}).json()

    detail_polls = []
    page.on("request", lambda request: detail_polls.append(request.url) if re.search(rf"/api/v1/jobs/{job['id']}/$", request.url) else None)
    with page.expect_request(re.compile(rf"/api/v1/jobs/{job['id']}/stream/")):
        page.goto(f"/jobs/{job['id']}")
    status = page.get_by_test_id("job-status")
    expect(status).to_have_attribute("data-status", "succeeded", timeout=JOB_TIMEOUT_MS)
    # Pushed, not polled: the page read the job once, then the stream carried every change.
    assert len(detail_polls) <= 2, detail_polls
    expect(page.get_by_test_id("stage-report")).to_have_attribute("data-status", "done")

    # Re-run from the job page: a new job, live too, whose report names the one it repeats.
    page.get_by_test_id("rerun-job").click()
    expect(page).not_to_have_url(re.compile(rf"/jobs/{job['id']}$"))
    expect(page.get_by_text(f"re-run of #{job['id']}")).to_be_visible()
    expect(page.get_by_test_id("job-status")).to_have_attribute("data-status", "succeeded", timeout=JOB_TIMEOUT_MS)
    page.get_by_test_id("open-report").click()
    expect(page.get_by_test_id("rerun-summary")).to_contain_text(f"Re-run of deployment #{job['id']}")
    expect(page.get_by_test_id("estimate-error").first).to_be_visible()
    # The chart's fixed legend names only what is drawn; both FP32 builds sit at one accuracy,
    # which once froze the page on "Loading charts…" (a zero-height axis range).
    expect(page.get_by_test_id("chart-legend").first).to_have_text(re.compile("Within tolerance.*Recommended.*Tolerance"))
    expect_named_points(page, ["fp32 on onnxruntime", "fp32 on openvino"])
    expect_zoom_changes_the_axis_range(page)
    # The per-operator caption says what its numbers are; the per-layer view lists the agent's layers.
    caption = page.get_by_test_id("op-type-caption").first
    expect(caption).to_contain_text("so the bars add up to the p50")
    expect(caption).to_contain_text("a mean per run over 10 runs of a separate session with per-node timing on")
    expect(page.get_by_test_id("layer-table").first.get_by_test_id("layer-row").first).to_be_visible()
    screenshot(page, "16-rerun-report")
    # At 1400 px and at 800 px the chart follows its card: every label inside the plot, no sideways page scroll.
    for width in (1400, 800):
        page.set_viewport_size({"width": width, "height": 900})
        wait_for_page(page, "document.querySelector('.u-over').getBoundingClientRect().right <= window.innerWidth")
        expect_named_points(page, ["fp32 on onnxruntime", "fp32 on openvino"])
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
        screenshot(page, f"16c-report-{width}px")
    page.set_viewport_size({"width": 1280, "height": 800})

    # The performance database: both jobs' measurements, the device chart and the job comparison.
    page.get_by_role("link", name="Performance").click()
    expect(page.get_by_role("heading", name="Performance", level=1)).to_be_visible()
    page.get_by_label("Model", exact=True).select_option(label="digits")
    measured = api(stack, user, "GET", f"performance/?model={model['id']}").json()["count"]
    assert measured >= 2, "two jobs measured at least one variant each"
    rows = page.get_by_test_id("performance-row")
    expect(rows).to_have_count(measured)
    expect(rows.first).to_contain_text("perf-box")
    expect(page.get_by_test_id("device-chart")).to_contain_text("perf-box")
    expect(page.get_by_test_id("toolchain-chart")).to_contain_text("onnxruntime")
    expect(page.get_by_test_id("job-comparison")).to_contain_text("fp32")
    screenshot(page, "17-performance")
    # A long page: the sidebar is still there at the bottom of the window once scrolled down.
    page.set_viewport_size({"width": 1280, "height": 500})
    page.evaluate("window.scrollTo(0, document.body.scrollHeight)")
    assert page.evaluate("document.elementFromPoint(20, window.innerHeight - 5).closest('.sidebar, .shell') !== null")
    assert "gradient" in page.evaluate("getComputedStyle(document.querySelector('.shell')).backgroundImage")

    # Another model gets an estimate on this device before any job runs.
    other = tmp_path / "transformer.onnx"
    onnx.save(build_transformer_like(), str(other))
    with open(other, "rb") as handle:
        second = api(stack, user, "POST", "models/", data={"name": "encoder"}, files={"file": ("transformer.onnx", handle)}).json()
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"/models/{second['id']}")
    estimate = page.get_by_test_id("latency-estimate")
    expect(estimate.get_by_test_id("estimate-row").first).to_contain_text("perf-box")
    expect(estimate).to_contain_text("ms")
    # The estimate's table fits the page: no horizontal scroll at laptop width.
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
    screenshot(page, "18-model-estimate")
