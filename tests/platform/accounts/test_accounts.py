"""Accounts: tokens are hashed and revocable, sessions need CSRF, viewers cannot write."""
from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from kiln.accounts.models import ApiToken
from tests.conftest import make_tenant

pytestmark = pytest.mark.django_db


def test_token_is_stored_only_as_a_digest(tenant):
    stored = ApiToken.objects.get(user=tenant.user)
    assert tenant.token.startswith("kiln_pat_")
    assert tenant.token not in {stored.digest, stored.lookup_prefix}
    assert len(stored.digest) == 64
    assert tenant.client.get("/api/v1/auth/me/").status_code == 200


def test_created_token_is_shown_once_and_works(tenant):
    created = tenant.client.post("/api/v1/tokens/", {"name": "ci", "expires_in_days": 7}, format="json")
    assert created.status_code == 201
    secret = created.json()["token"]
    listing = tenant.client.get("/api/v1/tokens/").json()
    assert all("token" not in row for row in listing)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert client.get("/api/v1/models/").status_code == 200


def test_revoked_and_expired_tokens_are_refused(tenant):
    created = tenant.client.post("/api/v1/tokens/", {"name": "short"}, format="json").json()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {created['token']}")
    assert tenant.client.post(f"/api/v1/tokens/{created['id']}/revoke/").status_code == 200
    response = client.get("/api/v1/models/")
    assert response.status_code == 401
    assert "revoked" in response.json()["error"]
    expired = tenant.client.post("/api/v1/tokens/", {"name": "expired"}, format="json").json()
    ApiToken.objects.filter(pk=expired["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {expired['token']}")
    assert client.get("/api/v1/models/").status_code == 401


def test_revoking_a_token_again_keeps_the_first_revocation_time(tenant):
    created = tenant.client.post("/api/v1/tokens/", {"name": "twice"}, format="json").json()
    first = tenant.client.post(f"/api/v1/tokens/{created['id']}/revoke/")
    revoked_at = ApiToken.objects.get(pk=created["id"]).revoked_at
    assert first.status_code == 200 and revoked_at is not None
    assert tenant.client.post(f"/api/v1/tokens/{created['id']}/revoke/").status_code == 200
    assert ApiToken.objects.get(pk=created["id"]).revoked_at == revoked_at


def test_anonymous_and_garbage_tokens_get_401():
    assert APIClient().get("/api/v1/models/").status_code == 401
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Bearer kiln_pat_notarealtoken")
    assert client.get("/api/v1/models/").status_code == 401


def test_create_api_token_command_prints_a_working_token_last():
    out = StringIO()
    call_command("create_api_token", "--username", "bob", "--organization", "Bobs Models", stdout=out, stderr=StringIO())
    secret = out.getvalue().strip().splitlines()[-1]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    me = client.get("/api/v1/auth/me/").json()
    assert me["user"]["username"] == "bob"
    assert me["organization"]["name"] == "Bobs Models"


def test_session_login_requires_csrf_for_writes(db):
    make_tenant(username="carol", organization="Carol Co", password="a-long-password-1")
    client = APIClient(enforce_csrf_checks=True)
    csrf = client.get("/api/v1/auth/csrf/").json()["csrf_token"]
    login = client.post("/api/v1/auth/login/", {"username": "carol", "password": "a-long-password-1"}, format="json", HTTP_X_CSRFTOKEN=csrf)
    assert login.status_code == 200, login.content
    assert login.json()["organization"]["name"] == "Carol Co"
    without = client.post("/api/v1/tokens/", {"name": "x"}, format="json")
    assert without.status_code == 403
    csrf = client.cookies["csrftoken"].value
    with_csrf = client.post("/api/v1/tokens/", {"name": "x"}, format="json", HTTP_X_CSRFTOKEN=csrf)
    assert with_csrf.status_code == 201


def test_wrong_password_is_a_clear_400(db):
    make_tenant(username="dave", organization="Dave Co", password="a-long-password-1")
    response = APIClient().post("/api/v1/auth/login/", {"username": "dave", "password": "nope"}, format="json")
    assert response.status_code == 400
    assert response.json()["error"] == "Wrong username or password."


def test_signup_creates_an_owned_organization(db):
    client = APIClient()
    response = client.post("/api/v1/auth/signup/", {"username": "erin", "password": "correct-horse-battery", "organization": "Erin Labs"}, format="json")
    assert response.status_code == 201
    assert response.json()["organization"]["role"] == "owner"
    assert response.json()["organization"]["slug"] == "erin-labs"


def test_viewer_can_read_but_not_write(db):
    viewer = make_tenant(username="vic", organization="Acme", role="viewer")
    assert viewer.client.get("/api/v1/models/").status_code == 200
    response = viewer.client.post("/api/v1/agents/registration-tokens/", {"name": "x"}, format="json")
    assert response.status_code == 403
    assert "Viewers" in response.json()["error"]


def test_session_user_switches_between_own_organizations_only(db):
    first = make_tenant(username="fay", organization="First", password="a-long-password-1")
    second = make_tenant(username="fay", organization="Second")
    stranger = make_tenant(username="gus", organization="Elsewhere")
    client = APIClient()
    client.post("/api/v1/auth/login/", {"username": "fay", "password": "a-long-password-1"}, format="json")
    switched = client.post("/api/v1/auth/organization/", {"organization": second.organization.id}, format="json")
    assert switched.json()["organization"]["id"] == second.organization.id
    assert client.post("/api/v1/auth/organization/", {"organization": stranger.organization.id}, format="json").status_code == 404
    assert first.organization.id != second.organization.id


def test_owner_adds_a_member_who_can_then_switch_to_the_organization(db):
    owner = make_tenant(username="olga", organization="Olga Inc")
    make_tenant(username="pete", organization="Pete Co", password="a-long-password-1")
    added = owner.client.post("/api/v1/members/", {"username": "pete", "role": "viewer"}, format="json")
    assert added.status_code == 201, added.content
    assert owner.client.post("/api/v1/members/", {"username": "pete"}, format="json").status_code == 409
    assert owner.client.post("/api/v1/members/", {"username": "nobody"}, format="json").status_code == 400
    client = APIClient()
    client.post("/api/v1/auth/login/", {"username": "pete", "password": "a-long-password-1"}, format="json")
    names = {org["name"] for org in client.get("/api/v1/auth/me/").json()["organizations"]}
    assert names == {"Olga Inc", "Pete Co"}
    client.post("/api/v1/auth/organization/", {"organization": owner.organization.id}, format="json")
    assert client.get("/api/v1/auth/me/").json()["organization"]["role"] == "viewer"


def test_only_owners_change_members_and_the_last_owner_stays(db):
    owner = make_tenant(username="olga", organization="Olga Inc")
    member = make_tenant(username="max", organization="Olga Inc", role="member")
    assert member.client.post("/api/v1/members/", {"username": "olga"}, format="json").status_code == 403
    rows = {row["username"]: row for row in owner.client.get("/api/v1/members/").json()}
    owner_row, member_row = rows["olga"], rows["max"]
    assert owner.client.patch(f"/api/v1/members/{owner_row['id']}/", {"role": "member"}, format="json").status_code == 409
    assert owner.client.delete(f"/api/v1/members/{owner_row['id']}/").status_code == 409
    promoted = owner.client.patch(f"/api/v1/members/{member_row['id']}/", {"role": "owner"}, format="json")
    assert promoted.json()["role"] == "owner"


def test_removing_a_member_revokes_their_tokens_there(db):
    owner = make_tenant(username="olga", organization="Olga Inc")
    member = make_tenant(username="max", organization="Olga Inc", role="member")
    assert member.client.get("/api/v1/models/").status_code == 200
    member_row = next(row for row in owner.client.get("/api/v1/members/").json() if row["username"] == "max")
    assert owner.client.delete(f"/api/v1/members/{member_row['id']}/").status_code == 204
    assert member.client.get("/api/v1/models/").status_code == 401


def test_members_of_another_organization_are_not_found(db):
    owner = make_tenant(username="olga", organization="Olga Inc")
    other = make_tenant(username="rex", organization="Rex Ltd")
    foreign = other.client.get("/api/v1/members/").json()[0]["id"]
    assert owner.client.patch(f"/api/v1/members/{foreign}/", {"role": "viewer"}, format="json").status_code == 404
    assert owner.client.delete(f"/api/v1/members/{foreign}/").status_code == 404


def test_password_guessing_is_throttled(db, settings, monkeypatch):
    from rest_framework.throttling import SimpleRateThrottle

    # The throttle's clock stands still: 40 hashed logins can outlast its minute on a loaded machine.
    monkeypatch.setattr(SimpleRateThrottle, "timer", lambda self: 1_000_000.0)
    make_tenant(username="tina", organization="Tina Co", password="a-long-password-1")
    client = APIClient()
    answers = [client.post("/api/v1/auth/login/", {"username": "tina", "password": f"guess-{i}"}, format="json").status_code for i in range(40)]
    assert answers[0] == 400 and answers[-1] == 429
    assert client.post("/api/v1/auth/login/", {"username": "tina", "password": "a-long-password-1"}, format="json").status_code == 429
