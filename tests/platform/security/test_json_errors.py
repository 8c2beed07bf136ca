"""Every response under /api/ is JSON in the documented `{"error", "code"}` shape: unknown routes,
server errors, bodies over the limits."""
from __future__ import annotations

import pytest
from django.test import Client
from django.urls import include, path

from kiln import urls as kiln_urls
from tests.platform.security.conftest import assert_json_error

pytestmark = pytest.mark.django_db


def explode(request):
    raise RuntimeError("boom at /srv/secret/path")


urlpatterns = [path("api/v1/explode/", explode), path("", include("kiln.urls"))]
handler500 = kiln_urls.handler500


@pytest.mark.parametrize("route", ["/api/v1/nope/", "/api/v1/models/abc/", "/api/agent/v1/nope", "/api/", "/api/v1/jobs/1/nope/"])
def test_unknown_api_routes_are_json_404(tenant, route):
    assert_json_error(tenant.client.get(route), 404, "not_found")
    assert_json_error(Client().get(route), 404, "not_found")


@pytest.mark.urls(__name__)
def test_server_errors_are_json_and_reveal_nothing(tenant):
    client = Client(raise_request_exception=False)
    body = assert_json_error(client.get("/api/v1/explode/"), 500, "server_error")
    assert "boom" not in body["error"] and "/srv" not in body["error"]


def test_declared_body_over_the_upload_limit_is_json_413(tenant, settings):
    settings.MAX_UPLOAD_BYTES = 1024
    response = tenant.client.generic("POST", "/api/v1/models/", b"x" * 2048, content_type="application/octet-stream")
    body = assert_json_error(response, 413, "upload_too_large")
    assert "KILN_MAX_UPLOAD_BYTES" in body["error"]


def test_form_body_over_the_memory_limit_is_json_413(tenant, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    response = tenant.client.post("/api/v1/tokens/", "name=" + "x" * 4096, content_type="application/x-www-form-urlencoded")
    assert_json_error(response, 413)


def test_wrong_method_is_json_405(tenant):
    assert_json_error(tenant.client.put("/api/v1/jobs/"), 405, "method_not_allowed")


def test_pages_outside_the_api_stay_html():
    response = Client().get("/static/nope.css")
    assert response.status_code == 404
    assert not response["Content-Type"].startswith("application/json")
