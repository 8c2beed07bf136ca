"""Revocation takes effect at once on every server process: two real web servers (separate process
trees, as two hosts would run them) share the database and the cache; what one revokes, the other
refuses on its very next request, though it had checked (and cached) the token a moment before.

Shown for an API token and every token made with it (and with those), an agent's heartbeats, and a
member's role; with Redis (several hosts) and with the embedded default's files (one host)."""
from __future__ import annotations

import json
import os

import pytest

from kiln.accounts.models import ApiToken, Membership
from kiln.accounts.services import api_token_create
from kiln.core.tokens import token_digest
from kiln.fleet.services import agent_register, registration_token_create
from tests.conftest import make_tenant
from tests.platform.security.web_servers import web_server

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

PORT = 18140


def bearer(secret: str) -> dict:
    return {"Authorization": f"Bearer {secret}"}


@pytest.mark.parametrize("shared", ["redis", "files"])
def test_what_one_server_process_revokes_the_other_refuses_at_once(tmp_path, shared):
    if shared == "redis" and not os.environ.get("REDIS_URL"):
        pytest.skip("REDIS_URL is not set: the multi-host path needs a Redis server")
    environment = {} if shared == "redis" else {"REDIS_URL": ""}
    owner = make_tenant(username="olga", organization="Org")
    _, owner_console = api_token_create(user=owner.user, organization=owner.organization, name="console")
    member = make_tenant(username="max", organization="Org", role="member")
    _, registration = registration_token_create(organization=owner.organization, user=owner.user, name="lab")
    agent, agent_secret = agent_register(registration_secret=registration, name="board", labels={}, capabilities={"runtimes": {"onnxruntime": "1"}})
    port = PORT + (0 if shared == "redis" else 2)
    with web_server(port, tmp_path / "a.log", **environment) as first, web_server(port + 1, tmp_path / "b.log", **environment) as second:
        def models_on_second(secret: str) -> int:
            return second.get("/api/v1/models/", headers=bearer(secret)).status_code

        def heartbeat_on_second() -> int:
            return second.post("/api/agent/v1/heartbeat", json={}, headers=bearer(agent_secret)).status_code

        # The second server checks each token once and then answers from its cache.
        child = second.post("/api/v1/tokens/", json={"name": "minted by a token"}, headers=bearer(owner.token)).json()
        grandchild = second.post("/api/v1/tokens/", json={"name": "minted by that"}, headers=bearer(child["token"])).json()
        assert child["created_by_token"] == ApiToken.objects.get(digest=token_digest(owner.token)).id
        for _ in range(2):
            assert [models_on_second(s) for s in (owner.token, child["token"], grandchild["token"])] == [200, 200, 200]
            assert heartbeat_on_second() == 200
            assert second.post("/api/v1/tokens/", json={"name": "member's"}, headers=bearer(member.token)).status_code == 201

        # The first server revokes the owner's token: the second refuses it and both descendants at once.
        token_id = ApiToken.objects.get(digest=token_digest(owner.token)).id
        assert first.post(f"/api/v1/tokens/{token_id}/revoke/", headers=bearer(owner_console)).status_code == 200
        assert [models_on_second(s) for s in (owner.token, child["token"], grandchild["token"])] == [401, 401, 401]
        assert models_on_second(owner_console) == 200
        # A token cannot be minted any more with a revoked one either.
        assert second.post("/api/v1/tokens/", json={"name": "late"}, headers=bearer(child["token"])).status_code == 401

        # An agent revoked on the first server: its next heartbeat on the second is refused.
        assert first.post(f"/api/v1/agents/{agent.id}/revoke/", headers=bearer(owner_console)).status_code == 200
        assert heartbeat_on_second() == 401

        # A member made a viewer on the first server can no longer write on the second.
        membership = Membership.objects.get(user=member.user)
        assert first.patch(f"/api/v1/members/{membership.id}/", json={"role": "viewer"}, headers=bearer(owner_console)).status_code == 200
        refused = second.post("/api/v1/tokens/", json={"name": "viewer's"}, headers=bearer(member.token))
        assert refused.status_code == 403 and "Viewers" in refused.json()["error"]

        # And the event stream's 404 is JSON through the real server too.
        stream = second.get("/api/v1/jobs/987654/stream/", headers={**bearer(owner_console), "Accept": "text/event-stream"})
        assert stream.status_code == 404 and stream.headers["Content-Type"] == "application/json"
        assert json.loads(stream.content)["code"] == "not_found"
    assert ApiToken.objects.filter(revoked_at__isnull=False).count() == 3
