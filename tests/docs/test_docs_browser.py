"""The documentation site in Chromium, served by a live Kiln: it renders under the server's strict Content-Security-Policy
(no violation), its navigation and search work with nothing fetched from elsewhere, and it reads at 1366, 800 and 390 px.
Screenshots land in test-artifacts/screenshots/docs-*.png."""
from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.e2e.test_ui import CHROMIUM, CHROMIUM_ARGS, SCREENSHOTS

pytestmark = [pytest.mark.browser]

WIDTHS = (1366, 800, 390)


# Module scope: Playwright's sync API keeps an event loop on this thread until it stops (see tests/e2e/test_ui.py).
@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"Chromium not found at {CHROMIUM}; apt-get install -y chromium (or set KILN_CHROMIUM)")
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    playwright = sync_playwright().start()
    chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
    yield chromium
    chromium.close()
    playwright.stop()


@pytest.fixture
def docs_url(live_server, settings, built_site) -> str:
    settings.DOCS_SITE = built_site
    return live_server.url + "/docs/"


def open_page(browser, url: str, width: int, problems: list[str], origins: set[str]):
    context = browser.new_context(viewport={"width": width, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()
    page.on("console", lambda message: problems.append(message.text) if "Content Security Policy" in message.text else None)
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on("request", lambda request: origins.add(urlparse(request.url).netloc) if request.url.startswith("http") else None)
    page.goto(url)
    return context, page


def test_the_docs_read_in_chromium_under_the_strict_policy(browser, docs_url):
    from playwright.sync_api import expect

    problems: list[str] = []
    origins: set[str] = set()
    for width in WIDTHS:
        context, page = open_page(browser, docs_url, width, problems, origins)
        try:
            expect(page.locator("article h1")).to_have_text(re.compile(r"^Kiln\W*$"))
            expect(page.get_by_role("link", name="Raw data and recipes").first).to_be_attached()
            # No page-level sideways scroll at any width.
            assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
            page.screenshot(path=str(screenshot_path(f"docs-home-{width}")), full_page=False)
            page.goto(docs_url + "guides/browser/")
            expect(page.locator("article h1")).to_contain_text("Walk-through in the browser")
            assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")
            page.screenshot(path=str(screenshot_path(f"docs-guide-{width}")), full_page=False)
        finally:
            context.close()
    assert not problems, problems
    assert origins == {urlparse(docs_url).netloc}, f"requests left the server: {origins}"


def test_search_finds_a_page_offline(browser, docs_url):
    from playwright.sync_api import expect

    problems: list[str] = []
    origins: set[str] = set()
    context, page = open_page(browser, docs_url, 1366, problems, origins)
    try:
        page.get_by_role("textbox", name="Search").or_(page.locator("label.md-search__icon")).first.click()
        page.keyboard.type("install-service")
        results = page.locator(".md-search-result__item")
        # The theme builds its search index in a web worker at the first search ("Initializing search"): past expect's
        # 5 s beside CI's other shards on 2 cores (2026-12-07), so it has a minute.
        expect(results.first).to_be_visible(timeout=60_000)
        expect(page.locator(".md-search-result")).to_contain_text("Adding a device")
        page.screenshot(path=str(screenshot_path("docs-search-1366")), full_page=False)
        # Other pages mention the guide too (configuration links to it): open the guide's own result.
        page.locator('.md-search-result__link[href*="guides/devices/"]').first.click()
        page.wait_for_url(re.compile(r".*/docs/guides/devices/.*"))
        expect(page.locator("article h1")).to_contain_text("Adding a device")
    finally:
        context.close()
    assert not problems, problems
    assert origins == {urlparse(docs_url).netloc}, f"requests left the server: {origins}"


def screenshot_path(name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS / f"{name}.png"
