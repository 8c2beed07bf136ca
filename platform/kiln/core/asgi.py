"""Kiln's ASGI handler: long-lived requests park no thread, and oversized bodies are refused unread.

Django runs each ASGI request inside its own ThreadSensitiveContext, whose executor thread lives
until the response ends, even while an async view only awaits a notification. For the routes
served by async views (the long-polls that wait, and the heartbeat every agent sends all the
time) this handler leaves that context out: their few sync steps (request signals, Django's
own middleware) run on asgiref's shared sync thread, and database work goes through
`kiln.core.db.run_in_db_thread`. Every other request keeps Django's per-request thread.

Django's ASGI handler also reads the whole body (spooled to disk) before any middleware runs, so
the upload limit is enforced here: a declared length over KILN_MAX_UPLOAD_BYTES is answered 413
before reading, and a body without one is cut off once it passes the limit.
"""
from __future__ import annotations

import re

from django.conf import settings
from django.core.handlers.asgi import ASGIHandler

from .errors import json_error, upload_too_large

ASYNC_ROUTES = re.compile(r"^/api/agent/v1/(tasks/lease|heartbeat)/?$|^/api/v1/jobs/\d+/stream/?$")


class _BodyTooLarge(Exception):
    pass


def served_async(scope: dict) -> bool:
    return bool(ASYNC_ROUTES.match(scope.get("path", "")))


def declared_length(scope: dict) -> int:
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


class KilnASGIHandler(ASGIHandler):
    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and declared_length(scope) > settings.MAX_UPLOAD_BYTES:
            await self._refuse_too_large(send)
            return
        try:
            if scope["type"] == "http" and served_async(scope):
                await self.handle(scope, receive, send)
            else:
                await super().__call__(scope, receive, send)
        except _BodyTooLarge:
            await self._refuse_too_large(send)

    async def read_body(self, receive):
        received = 0

        async def bounded_receive():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > settings.MAX_UPLOAD_BYTES:
                raise _BodyTooLarge
            return message

        return await super().read_body(bounded_receive)

    async def _refuse_too_large(self, send) -> None:
        refusal = upload_too_large()
        await self.send_response(json_error(refusal.message, refusal.error_code, refusal.status_code), send)
