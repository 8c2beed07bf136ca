"""A stolen API token cannot leave tokens behind: what a token mints expires no later than it and is
revoked with it (and what those minted, all the way down)."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from kiln.accounts.models import ApiToken
from kiln.accounts.services import api_token_create
from kiln.core.errors import KilnError
from kiln.core.tokens import token_digest

pytestmark = pytest.mark.django_db


def client_with(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_revoking_a_token_revokes_every_token_it_made(tenant):
    maker = ApiToken.objects.get(digest=token_digest(tenant.token))
    child = tenant.client.post("/api/v1/tokens/", {"name": "child"}, format="json").json()
    grandchild = client_with(child["token"]).post("/api/v1/tokens/", {"name": "grandchild"}, format="json").json()
    _, unrelated = api_token_create(user=tenant.user, organization=tenant.organization, name="unrelated")
    assert child["created_by_token"] == maker.id and grandchild["created_by_token"] == child["id"]
    assert client_with(unrelated).post(f"/api/v1/tokens/{maker.id}/revoke/").status_code == 200
    for secret in (tenant.token, child["token"], grandchild["token"]):
        assert client_with(secret).get("/api/v1/models/").status_code == 401
    assert client_with(unrelated).get("/api/v1/models/").status_code == 200
    listed = {token["name"]: token["revoked"] for token in client_with(unrelated).get("/api/v1/tokens/").json()}
    assert listed == {"tests": True, "child": True, "grandchild": True, "unrelated": False}


def test_a_minted_token_expires_no_later_than_its_maker(tenant):
    _, short = api_token_create(user=tenant.user, organization=tenant.organization, name="short", expires_in_days=1)
    forever = client_with(short).post("/api/v1/tokens/", {"name": "forever", "expires_in_days": None}, format="json").json()
    longer = client_with(short).post("/api/v1/tokens/", {"name": "longer", "expires_in_days": 30}, format="json").json()
    maker_expiry = ApiToken.objects.get(name="short").expires_at
    for minted in (forever, longer):
        assert ApiToken.objects.get(pk=minted["id"]).expires_at == maker_expiry
    sooner = client_with(short).post("/api/v1/tokens/", {"name": "sooner", "expires_in_days": 1}, format="json").json()
    assert ApiToken.objects.get(pk=sooner["id"]).expires_at <= maker_expiry + timedelta(seconds=5)


def test_a_token_revoked_while_it_mints_mints_nothing(tenant):
    maker = ApiToken.objects.get(digest=token_digest(tenant.token))
    ApiToken.objects.filter(pk=maker.pk).update(revoked_at=timezone.now())  # revoked after the request authenticated
    with pytest.raises(KilnError) as refused:
        api_token_create(user=tenant.user, organization=tenant.organization, name="late", created_by_token=maker)
    assert refused.value.status_code == 401
    assert not ApiToken.objects.filter(name="late").exists()


def test_tokens_made_after_signing_in_have_no_maker(tenant):
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.get(username="alice")
    user.set_password("a-long-password-1")
    user.save()
    client = APIClient(enforce_csrf_checks=False)
    client.force_authenticate(user=user)
    made = client.post("/api/v1/tokens/", {"name": "from the ui"}, format="json")
    assert made.status_code == 201 and made.json()["created_by_token"] is None
