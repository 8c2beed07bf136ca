"""Kiln serves the built documentation at /docs/ (kiln.core.docs_site): pages, assets, the strict CSP, and the page
that says how to build the site when it is missing."""
from __future__ import annotations

import base64
import hashlib
import re
from urllib.parse import urljoin

import pytest


@pytest.fixture
def site(settings, built_site):
    settings.DOCS_SITE = built_site
    return built_site


def inline_script_hashes(html: bytes) -> set[str]:
    return {"'sha256-" + base64.b64encode(hashlib.sha256(body).digest()).decode() + "'"
            for body in re.findall(rb"<script>(.*?)</script>", html, re.DOTALL)}


def test_the_index_and_a_guide_are_served_as_html(client, site):
    index = client.get("/docs/")
    assert index.status_code == 200
    assert index["Content-Type"] == "text/html; charset=utf-8"
    assert b"<title>Kiln</title>" in index.content and b"Where to start" in index.content
    guide = client.get("/docs/guides/browser/")
    assert guide.status_code == 200
    assert guide["Content-Type"] == "text/html; charset=utf-8"
    assert b"Walk-through in the browser" in guide.content and b"New deployment" in guide.content
    reference = client.get("/docs/reference/rest-api/")
    assert reference.status_code == 200 and b"/api/v1/jobs/{id}/report/" in reference.content


def test_addresses_without_a_slash_are_redirected(client, site):
    assert client.get("/docs")["Location"] == "/docs/"
    answer = client.get("/docs/guides/browser")
    assert answer.status_code == 301 and answer["Location"] == "/docs/guides/browser/"


def test_assets_are_served_with_their_types(client, site):
    page = client.get("/docs/guides/cli/").content.decode()
    stylesheet = re.search(r'<link rel="stylesheet" href="([^"]+main[^"]+\.css)"', page).group(1)
    script = re.search(r'<script src="([^"]+bundle[^"]+\.js)"', page).group(1)
    # Relative to the page, resolved as the browser does.
    css = client.get(urljoin("/docs/guides/cli/", stylesheet))
    assert css.status_code == 200 and css["Content-Type"].startswith("text/css")
    js = client.get(urljoin("/docs/guides/cli/", script))
    assert js.status_code == 200 and "javascript" in js["Content-Type"]
    index = client.get("/docs/search/search_index.json")
    assert index.status_code == 200 and index["Content-Type"].startswith("application/json")
    assert "Raw data and recipes" in b"".join(index.streaming_content).decode()


def test_pages_keep_the_strict_policy_allowing_only_their_own_inline_scripts(client, site):
    answer = client.get("/docs/guides/devices/")
    policy = answer["Content-Security-Policy"]
    hashes = inline_script_hashes(answer.content)
    assert hashes, "the theme's inline scripts are expected in the page"
    script_src = re.search(r"script-src ([^;]+)", policy).group(1).split()
    assert set(script_src) == {"'self'", *hashes}
    assert "unsafe-inline" not in policy and "style-src 'self'" in policy and "frame-ancestors 'none'" in policy


def test_unknown_hidden_and_outside_paths_are_not_served(client, site, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the web")
    (site / "leak").symlink_to(secret)
    try:
        for path in ("/docs/no-such-page/", "/docs/leak", "/docs/../pyproject.toml", "/docs/%2e%2e/pyproject.toml",
                     "/docs/.hidden", "/docs/assets/..%2f..%2fREADME.md"):
            answer = client.get(path)
            assert answer.status_code == 404, path
            assert b"not for the web" not in answer.content
        assert b"documentation's home page" in client.get("/docs/no-such-page/").content
    finally:
        (site / "leak").unlink()


def test_only_reading_is_allowed(client, site):
    assert client.post("/docs/").status_code == 405
    assert client.head("/docs/").status_code == 200


def test_a_missing_build_says_how_to_build_it(client, settings, tmp_path):
    settings.DOCS_SITE = tmp_path / "site"
    for path in ("/docs/", "/docs/guides/browser/"):
        answer = client.get(path)
        assert answer.status_code == 200
        assert answer["Content-Type"] == "text/html; charset=utf-8"
        assert b"make docs" in answer.content and b"not built" in answer.content
