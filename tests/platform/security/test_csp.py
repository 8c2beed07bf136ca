"""The web UI is served under a strict Content-Security-Policy (the browser tests check that the
built UI runs under it with no violation)."""
from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def directives(response) -> dict[str, str]:
    policy = response["Content-Security-Policy"]
    return {part.split()[0]: part for part in (p.strip() for p in policy.split(";")) if part}


@pytest.mark.parametrize("path", ["/", "/models", "/api/docs/", "/api/v1/health/"])
def test_every_page_has_a_strict_policy(path):
    response = Client().get(path)
    assert response.status_code == 200
    policy = directives(response)
    assert policy["script-src"] == "script-src 'self'"
    assert policy["object-src"] == "object-src 'none'"
    assert policy["frame-ancestors"] == "frame-ancestors 'none'"
    assert "unsafe-inline" not in response["Content-Security-Policy"]
    assert "unsafe-eval" not in response["Content-Security-Policy"]


def test_api_docs_load_their_script_from_a_url_not_inline():
    page = Client().get("/api/docs/").content.decode()
    assert "<script>" not in page.replace(" ", "")
    script = Client().get("/api/docs/?script=")
    assert script.status_code == 200
    assert "SwaggerUIBundle" in script.content.decode()
