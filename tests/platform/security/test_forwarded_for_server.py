"""Through the real web server (gunicorn + Kiln's uvicorn workers, as `make up`, the Dockerfile and
docker-compose run it): a client cannot pick its own address with X-Forwarded-For, so the sign-in
throttle holds; a proxy the operator names in KILN_TRUSTED_PROXIES is believed."""
from __future__ import annotations

import pytest
import requests

from tests.conftest import make_tenant
from tests.platform.security.web_servers import web_server

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

PORT = 18130


def sign_in(url: str, forwarded_for: str | None = None) -> int:
    session = requests.Session()
    session.get(f"{url}/api/v1/auth/csrf/", timeout=30)
    headers = {"X-CSRFToken": session.cookies.get("csrftoken", "")}
    if forwarded_for is not None:
        headers["X-Forwarded-For"] = forwarded_for
    answer = session.post(f"{url}/api/v1/auth/login/", json={"username": "tina", "password": "wrong-guess"}, headers=headers, timeout=30)
    return answer.status_code


def test_thirty_failed_sign_ins_then_a_forged_forwarded_for_is_still_throttled(tmp_path):
    make_tenant(username="tina", organization="Tina", password="a-long-password-1")
    with web_server(PORT, tmp_path / "server.log") as server:  # KILN_TRUSTED_PROXIES unset, KILN_CREDENTIALS_RATE 30/min
        answers = [sign_in(server.url) for _ in range(30)]
        assert answers == [400] * 30
        forged = [sign_in(server.url, forwarded_for=f"203.0.113.{i}") for i in range(5)]
        forged.append(sign_in(server.url, forwarded_for="127.0.0.2, 198.51.100.1"))
    assert forged == [429] * 6


def test_a_named_proxy_is_believed_and_the_client_s_own_entries_are_not(tmp_path):
    make_tenant(username="tina", organization="Tina", password="a-long-password-1")
    with web_server(PORT + 1, tmp_path / "server.log", KILN_TRUSTED_PROXIES="127.0.0.1", KILN_CREDENTIALS_RATE="3/min") as server:
        # The proxy (this test, from 127.0.0.1) appends each client's address: one bucket per client.
        assert [sign_in(server.url, forwarded_for=f"198.51.100.{i}") for i in range(4)] == [400] * 4
        # One client forging the entries before the proxy's is still one client.
        forged = [sign_in(server.url, forwarded_for=f"10.9.9.{i}, 198.51.100.200") for i in range(4)]
    assert forged == [400, 400, 400, 429]


def test_every_way_to_run_the_server_leaves_forwarding_headers_to_kiln():
    """`make up` (web_server_command), the Dockerfile (whose CMD docker-compose's web runs) use the worker
    that does not rewrite the client address, and docker-compose passes KILN_TRUSTED_PROXIES through."""
    from pathlib import Path

    import yaml

    from kiln.core.management.commands.up import WEB_WORKER_CLASS, web_server_command

    repo = Path(__file__).resolve().parents[3]
    assert WEB_WORKER_CLASS in web_server_command(Path("/bin"), bind="127.0.0.1:1", workers=1, platform_dir=repo / "platform")
    assert f'"--worker-class", "{WEB_WORKER_CLASS}"' in (repo / "Dockerfile").read_text()
    compose = yaml.safe_load((repo / "docker-compose.yml").read_text())
    assert "command" not in compose["services"]["web"]
    assert "KILN_TRUSTED_PROXIES" in compose["x-kiln-env"]
