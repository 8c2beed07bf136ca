"""Users' API tokens are remembered per process: no lookup while cached, and what revokes them still does."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from kiln.accounts.models import ApiToken
from kiln.accounts.selectors import api_token_grant_from_secret
from tests.conftest import make_tenant

pytestmark = pytest.mark.django_db


def client_with(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_a_cached_token_spares_the_token_and_membership_lookups(tenant, settings, django_assert_max_num_queries, django_assert_num_queries):
    settings.API_TOKEN_AUTH_CACHE_SECONDS = 3600
    with django_assert_num_queries(2):  # the token with its user and organization, the membership
        grant = api_token_grant_from_secret(secret=tenant.token)
    assert grant.token.user == tenant.user and grant.membership.role == "owner"
    with django_assert_max_num_queries(0):
        again = api_token_grant_from_secret(secret=tenant.token)
    assert again.token.pk == grant.token.pk and again.membership.organization_id == tenant.organization.id
    assert api_token_grant_from_secret(secret=tenant.token[:-2] + "xx") is None
    other = make_tenant(username="bob", organization="Bobs")
    assert api_token_grant_from_secret(secret=other.token).token.user.username == "bob"


def test_a_remembered_grant_stays_as_read_whatever_a_request_does_to_its_copy(tenant, settings):
    settings.API_TOKEN_AUTH_CACHE_SECONDS = 3600
    first = api_token_grant_from_secret(secret=tenant.token)
    first.token.user.username = "changed by a request"
    first.membership.role = "viewer"
    second = api_token_grant_from_secret(secret=tenant.token)
    assert second.token.user.username == "alice" and second.membership.role == "owner"


def test_a_revoked_token_is_refused_at_once_though_this_process_cached_it(tenant, settings):
    settings.API_TOKEN_AUTH_CACHE_SECONDS = 3600
    created = tenant.client.post("/api/v1/tokens/", {"name": "script"}, format="json").json()
    script = client_with(created["token"])
    assert script.get("/api/v1/jobs/").status_code == 200
    assert tenant.client.post(f"/api/v1/tokens/{created['id']}/revoke/").status_code == 200
    assert script.get("/api/v1/jobs/").status_code == 401
    assert tenant.client.get("/api/v1/jobs/").status_code == 200


def test_a_role_change_and_a_removal_reach_a_cached_token_at_once(db, settings):
    settings.API_TOKEN_AUTH_CACHE_SECONDS = 3600
    owner = make_tenant(username="olga", organization="Olga Inc")
    member = make_tenant(username="max", organization="Olga Inc", role="member")
    assert member.client.post("/api/v1/tokens/", {"name": "x"}, format="json").status_code == 201
    rows = {row["username"]: row for row in owner.client.get("/api/v1/members/").json()}
    assert owner.client.patch(f"/api/v1/members/{rows['max']['id']}/", {"role": "viewer"}, format="json").status_code == 200
    refused = member.client.post("/api/v1/tokens/", {"name": "y"}, format="json")
    assert refused.status_code == 403 and "Viewers" in refused.json()["error"]
    assert member.client.get("/api/v1/models/").status_code == 200
    assert owner.client.delete(f"/api/v1/members/{rows['max']['id']}/").status_code == 204
    assert member.client.get("/api/v1/models/").status_code == 401


def test_a_revocation_made_elsewhere_is_refused_once_the_entry_expires(tenant, settings):
    """Another server process (or the admin) revoked the token: this process refuses it within the period."""
    settings.API_TOKEN_AUTH_CACHE_SECONDS = 1
    assert tenant.client.get("/api/v1/models/").status_code == 200
    ApiToken.objects.filter(user=tenant.user).update(revoked_at=timezone.now())
    time.sleep(1.1)  # an entry lives at most the period
    assert tenant.client.get("/api/v1/models/").status_code == 401


def test_without_a_period_every_request_checks_the_database(tenant, settings):
    settings.API_TOKEN_AUTH_CACHE_SECONDS = 0
    assert tenant.client.get("/api/v1/models/").status_code == 200
    ApiToken.objects.filter(user=tenant.user).update(revoked_at=timezone.now())
    assert tenant.client.get("/api/v1/models/").status_code == 401


def test_a_cached_token_is_refused_once_it_expires(tenant, settings, monkeypatch):
    settings.API_TOKEN_AUTH_CACHE_SECONDS = 3600
    created = tenant.client.post("/api/v1/tokens/", {"name": "daily", "expires_in_days": 1}, format="json").json()
    script = client_with(created["token"])
    assert script.get("/api/v1/models/").status_code == 200
    later = timezone.now() + timedelta(days=2)
    monkeypatch.setattr(timezone, "now", lambda: later)
    assert script.get("/api/v1/models/").status_code == 401


def test_last_use_is_written_at_most_once_a_minute_with_a_cached_token(tenant, settings, django_assert_max_num_queries):
    settings.API_TOKEN_AUTH_CACHE_SECONDS = 3600
    assert tenant.client.get("/api/v1/models/").status_code == 200
    used = ApiToken.objects.get(user=tenant.user).last_used_at
    assert used is not None
    with django_assert_max_num_queries(0):
        grant = api_token_grant_from_secret(secret=tenant.token)
    assert grant.token.last_used_at == used  # so the next call does not write it again


def test_a_session_logout_takes_effect_at_once(db):
    make_tenant(username="carol", organization="Carol Co", password="a-long-password-1")
    client = APIClient()
    assert client.post("/api/v1/auth/login/", {"username": "carol", "password": "a-long-password-1"}, format="json").status_code == 200
    assert client.get("/api/v1/models/").status_code == 200
    assert client.post("/api/v1/auth/logout/").status_code == 204
    assert client.get("/api/v1/models/").status_code == 401
