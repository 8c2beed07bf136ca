"""Kiln's ASGI handler: long-lived requests park no thread, and oversized bodies are refused unread.

Django runs each ASGI request inside its own ThreadSensitiveContext, whose executor thread lives
until the response ends, even while an async view only awaits a notification. For the routes
served by async views (the long-polls that wait, and the heartbeat every agent sends all the
time) this handler leaves that context out: their few sync steps (request signals, Django's
own middleware) run on asgiref's shared sync thread, and database work goes through
`kiln.core.db.run_in_db_thread`. Every other request keeps Django's per-request thread.

The agent's JSON routes (a fleet's nearly every request: AGENT_ROUTES) also skip the middleware they
do not use (sessions, CSRF, user authentication, messages: they authenticate by bearer token and
are CSRF-exempt) and run the rest on the event loop (AGENT_ROUTE_MIDDLEWARE), where Django would
hop to a thread and back for each of them. Registrations (a fleet coming up sends hundreds at
once) run at most AGENT_REGISTER_CONCURRENCY at a time per process; the others wait on the event loop
(no thread, no connection), so the burst cannot take every pooled database connection from the
heartbeats, lease checks and user requests behind it.

Every other request (the user's API, the UI, the admin) runs Django's whole middleware chain and
its view in one hop to the request's thread (SyncRouteHandler): Django would otherwise hop to the
thread and back for each middleware's request and response step (about 16 hops a request), each a
wait for the event loop, which under a fleet's load made a user's list take a second.

Django's ASGI handler also reads the whole body (spooled to disk) before any middleware runs, so
the upload limit is enforced here: a declared length over KILN_MAX_UPLOAD_BYTES is answered 413
before reading, and a body without one is cut off once it passes the limit.
"""
from __future__ import annotations

import asyncio
import re

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.core.exceptions import MiddlewareNotUsed
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.exception import convert_exception_to_response
from django.utils.module_loading import import_string

from .errors import json_error, upload_too_large

ASYNC_ROUTES = re.compile(r"^/api/agent/v1/(tasks/lease|heartbeat)/?$|^/api/v1/jobs/\d+/stream/?$")
# The agent calls a fleet makes all the time, JSON in and out (no files): heartbeat and lease
# (async views), and register, progress and result (DRF views, each in its own thread as usual).
AGENT_ROUTES = re.compile(r"^/api/agent/v1/(tasks/lease|heartbeat|register|tasks/\d+/(progress|result))$")
REGISTER_ROUTE = "/api/agent/v1/register"
# Settings' MIDDLEWARE in the same order, less what the agent routes do not use; none hops threads.
AGENT_ROUTE_MIDDLEWARE = [
    "kiln.core.middleware.ClientAddressMiddleware",
    "kiln.core.middleware.RequestMetricsMiddleware",
    "kiln.core.middleware.UploadLimitMiddleware",
    "kiln.core.middleware.ContentSecurityPolicyMiddleware",
    "kiln.core.middleware.InlineHeadersMiddleware",
]


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


class _BoundedBodyHandler(ASGIHandler):
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


class AgentRouteHandler(_BoundedBodyHandler):
    """Django's handler with AGENT_ROUTE_MIDDLEWARE instead of settings.MIDDLEWARE."""

    def load_middleware(self, is_async=False):
        self._view_middleware, self._template_response_middleware, self._exception_middleware = [], [], []
        handler = convert_exception_to_response(self._get_response_async)
        for path in reversed(AGENT_ROUTE_MIDDLEWARE):
            try:
                middleware = import_string(path)(handler)
            except MiddlewareNotUsed:
                continue
            handler = convert_exception_to_response(middleware)
        self._middleware_chain = handler


class SyncRouteHandler(_BoundedBodyHandler):
    """Django's handler with settings.MIDDLEWARE built sync: the chain and the view run in one hop to
    the request's thread (a ThreadSensitiveContext's), as under WSGI."""

    def load_middleware(self, is_async=False):
        super().load_middleware(is_async=False)

    async def get_response_async(self, request):
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)


class KilnASGIHandler(_BoundedBodyHandler):
    def __init__(self):
        super().__init__()
        self.agent_routes = AgentRouteHandler()
        self.sync_routes = SyncRouteHandler()
        self.registrations = asyncio.Semaphore(settings.AGENT_REGISTER_CONCURRENCY)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and declared_length(scope) > settings.MAX_UPLOAD_BYTES:
            await self._refuse_too_large(send)
            return
        try:
            if scope["type"] == "http" and AGENT_ROUTES.match(scope.get("path", "")):
                if served_async(scope):
                    await self.agent_routes.handle(scope, receive, send)
                elif scope.get("path") == REGISTER_ROUTE:
                    async with self.registrations, ThreadSensitiveContext():
                        await self.agent_routes.handle(scope, receive, send)
                else:
                    async with ThreadSensitiveContext():
                        await self.agent_routes.handle(scope, receive, send)
            elif scope["type"] == "http" and served_async(scope):
                await self.handle(scope, receive, send)
            elif scope["type"] == "http":
                async with ThreadSensitiveContext():
                    await self.sync_routes.handle(scope, receive, send)
            else:
                await super().__call__(scope, receive, send)
        except _BodyTooLarge:
            await self._refuse_too_large(send)

    async def _refuse_too_large(self, send) -> None:
        refusal = upload_too_large()
        await self.send_response(json_error(refusal.message, refusal.error_code, refusal.status_code), send)
