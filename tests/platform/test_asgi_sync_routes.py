"""Under ASGI, a user's request runs Django's whole middleware chain and its view in one thread hop, with the same answers."""
from __future__ import annotations

import asyncio
import json
from http.cookies import SimpleCookie

import pytest
from asgiref.sync import iscoroutinefunction

from kiln.core.asgi import KilnASGIHandler
from tests.conftest import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


async def _call(app, method: str, path: str, *, headers: dict | None = None, body: bytes = b"") -> tuple[int, dict, bytes]:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http", "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "", "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 80),
             "headers": [(b"host", b"127.0.0.1"), (b"content-length", str(len(body)).encode())]
             + [(name.lower().encode(), value.encode()) for name, value in (headers or {}).items()]}
    sent, done, pending = [], asyncio.Event(), [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        if pending:
            return pending.pop()
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    await app(scope, receive, send)
    start = sent[0]
    return start["status"], {k.decode().lower(): v.decode() for k, v in start["headers"]}, b"".join(m.get("body", b"") for m in sent[1:])


def call(app, method: str, path: str, **kwargs) -> tuple[int, dict, bytes]:
    return asyncio.run(_call(app, method, path, **kwargs))


def cookies_of(headers: dict) -> dict:
    jar = SimpleCookie()
    jar.load(headers.get("set-cookie", ""))
    return {name: morsel.value for name, morsel in jar.items()}


def test_the_user_chain_is_sync_and_answers_as_before(tenant):
    app = KilnASGIHandler()
    assert not iscoroutinefunction(app.sync_routes._middleware_chain)  # one hop to the request's thread, not one per middleware
    status, headers, body = call(app, "GET", "/api/v1/jobs/", headers={"Authorization": f"Bearer {tenant.token}"})
    assert status == 200 and json.loads(body)["results"] == []
    assert "default-src 'self'" in headers["content-security-policy"] and headers["x-frame-options"] == "DENY"
    status, _, body = call(app, "GET", "/api/v1/jobs/")
    assert status == 401 and json.loads(body)["error"]


def test_a_session_signs_in_with_csrf_through_the_sync_chain(db):
    make_tenant(username="carol", organization="Carol Co", password="a-long-password-1")
    app = KilnASGIHandler()
    _, headers, body = call(app, "GET", "/api/v1/auth/csrf/")
    csrf = json.loads(body)["csrf_token"]
    cookie = f"csrftoken={cookies_of(headers)['csrftoken']}"
    credentials = json.dumps({"username": "carol", "password": "a-long-password-1"}).encode()
    refused, _, _ = call(app, "POST", "/api/v1/auth/login/", headers={"Content-Type": "application/json", "Cookie": cookie}, body=credentials)
    assert refused == 403
    status, headers, body = call(app, "POST", "/api/v1/auth/login/", body=credentials,
                                 headers={"Content-Type": "application/json", "Cookie": cookie, "X-CSRFToken": csrf})
    assert status == 200, body
    session = cookies_of(headers)["sessionid"]
    status, _, body = call(app, "GET", "/api/v1/auth/me/", headers={"Cookie": f"sessionid={session}"})
    assert status == 200 and json.loads(body)["user"]["username"] == "carol"
