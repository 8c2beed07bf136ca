"""Who may do what inside one organization: only owners decide which devices may join (registration
tokens) or must leave (revoking an agent); a viewer reads everything but the package encryption key."""
from __future__ import annotations

import pytest

from kiln.fleet.models import Agent, RegistrationToken
from tests.conftest import make_tenant
from tests.platform.security.conftest import assert_json_error, register_agent

pytestmark = pytest.mark.django_db


@pytest.fixture
def member(tenant):
    return make_tenant(username="mia", organization="Acme", role="member")


@pytest.fixture
def viewer(tenant):
    return make_tenant(username="vic", organization="Acme", role="viewer")


@pytest.mark.parametrize("role", ["member", "viewer"])
def test_only_owners_create_and_revoke_registration_tokens(tenant, member, viewer, role):
    someone = {"member": member, "viewer": viewer}[role]
    refused = someone.client.post("/api/v1/agents/registration-tokens/", {"name": "sneaky"}, format="json")
    assert_json_error(refused, 403)
    assert not RegistrationToken.objects.exists()
    created = tenant.client.post("/api/v1/agents/registration-tokens/", {"name": "lab"}, format="json")
    assert created.status_code == 201
    token_id = created.json()["id"]
    # Members and viewers may see the list (names and dates, never secrets), not revoke from it.
    listed = someone.client.get("/api/v1/agents/registration-tokens/")
    assert listed.status_code == 200 and "token" not in listed.json()[0]
    assert_json_error(someone.client.post(f"/api/v1/agents/registration-tokens/{token_id}/revoke/"), 403)
    assert RegistrationToken.objects.get().revoked_at is None
    assert tenant.client.post(f"/api/v1/agents/registration-tokens/{token_id}/revoke/").status_code == 200


@pytest.mark.parametrize("role", ["member", "viewer"])
def test_only_owners_revoke_agents(tenant, member, viewer, role):
    someone = {"member": member, "viewer": viewer}[role]
    agent = register_agent(tenant)
    body = assert_json_error(someone.client.post(f"/api/v1/agents/{agent.agent_id}/revoke/"), 403)
    assert ("Only an owner" if role == "member" else "Viewers can read") in body["error"]
    assert Agent.objects.get().revoked_at is None
    assert someone.client.get(f"/api/v1/agents/{agent.agent_id}/").status_code == 200
    assert tenant.client.post(f"/api/v1/agents/{agent.agent_id}/revoke/").status_code == 200


def test_a_viewer_cannot_read_the_package_encryption_key(tenant, member, viewer):
    body = assert_json_error(viewer.client.get("/api/v1/packages/key/"), 403)
    assert "package encryption key" in body["error"]
    owners = tenant.client.get("/api/v1/packages/key/").json()["key"]
    assert member.client.get("/api/v1/packages/key/").json()["key"] == owners
    # The public signing key is public.
    assert viewer.client.get("/api/v1/packages/signing-key/").status_code == 200


def test_members_neither_see_nor_revoke_each_other_s_tokens(tenant, member, viewer):
    from kiln.accounts.models import ApiToken
    from kiln.core.tokens import token_digest

    owners = ApiToken.objects.get(digest=token_digest(tenant.token))
    assert owners.id not in [token["id"] for token in member.client.get("/api/v1/tokens/").json()]
    assert_json_error(member.client.post(f"/api/v1/tokens/{owners.id}/revoke/"), 404)
    assert ApiToken.objects.get(pk=owners.pk).revoked_at is None
    # Viewers change nothing, their own tokens included.
    assert_json_error(viewer.client.post("/api/v1/tokens/", {"name": "mine"}, format="json"), 403)
