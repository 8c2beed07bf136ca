"""Sign-in and sign-up need a CSRF token (or a same-origin request) before any session exists:
a form on another site cannot sign a browser into the attacker's account."""
from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from tests.conftest import make_tenant
from tests.platform.security.conftest import assert_json_error

pytestmark = pytest.mark.django_db

SIGNUP = {"username": "victim-browser", "password": "correct-horse-battery", "organization": "Attacker Org"}


def browser() -> APIClient:
    return APIClient(enforce_csrf_checks=True)


def test_cross_site_login_without_token_is_refused():
    make_tenant(username="attacker", organization="Evil", password="a-long-password-1")
    client = browser()
    response = client.post("/api/v1/auth/login/", {"username": "attacker", "password": "a-long-password-1"}, format="json")
    assert_json_error(response, 403)
    assert "sessionid" not in client.cookies
    assert client.get("/api/v1/auth/me/").status_code in (401, 403)


def test_cross_site_signup_without_token_is_refused_and_creates_nothing():
    response = browser().post("/api/v1/auth/signup/", SIGNUP, format="json")
    assert_json_error(response, 403)
    assert not get_user_model().objects.filter(username=SIGNUP["username"]).exists()


def test_form_posted_from_another_origin_is_refused_even_with_a_token():
    make_tenant(username="attacker", organization="Evil", password="a-long-password-1")
    client = browser()
    client.get("/api/v1/auth/csrf/")
    token = client.cookies["csrftoken"].value
    response = client.post(
        "/api/v1/auth/login/", {"username": "attacker", "password": "a-long-password-1"}, format="json",
        HTTP_X_CSRFTOKEN=token, HTTP_ORIGIN="https://evil.example",
    )
    assert_json_error(response, 403)


def test_the_ui_flow_with_the_csrf_cookie_signs_in():
    make_tenant(username="carol", organization="Carols", password="a-long-password-1")
    client = browser()
    client.get("/api/v1/auth/csrf/")
    response = client.post(
        "/api/v1/auth/login/", {"username": "carol", "password": "a-long-password-1"}, format="json",
        HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value,
    )
    assert response.status_code == 200, response.content
    assert client.get("/api/v1/auth/me/").json()["user"]["username"] == "carol"
