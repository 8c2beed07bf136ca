"""Kiln's middleware: upload limits, security headers, static files. Each serves sync and async alike.

Under ASGI one sync-only middleware turns the whole chain sync, and then an async view (the agent
lease long-poll) holds a thread for as long as it waits; so every middleware here has both paths.
"""
from __future__ import annotations

import time

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.core.exceptions import MiddlewareNotUsed
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.security import SecurityMiddleware
from whitenoise.middleware import WhiteNoiseMiddleware

from kiln.core import client_address, metrics
from kiln.core.errors import json_error, upload_too_large


def follow_mode(middleware, get_response) -> bool:
    """Whether what comes after `middleware` is async; if so, mark it a coroutine function so Django awaits it."""
    is_async = iscoroutinefunction(get_response)
    if is_async:
        markcoroutinefunction(middleware)
    return is_async


class DualModeMiddleware:
    """Base of a middleware with one sync and one async path, chosen by what comes after it."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = follow_mode(self, get_response)

    def __call__(self, request):
        if self.is_async:
            return self._acall(request)
        refusal = self.refuse(request)
        return refusal if refusal is not None else self.finish(self.get_response(request))

    async def _acall(self, request):
        refusal = self.refuse(request)
        return refusal if refusal is not None else self.finish(await self.get_response(request))

    def refuse(self, request):
        """A response that ends the request here, or None (must not touch the database)."""
        return None

    def finish(self, response):
        return response


class ClientAddressMiddleware(DualModeMiddleware):
    """REMOTE_ADDR becomes the client's address, read through the proxies in KILN_TRUSTED_PROXIES only
    (kiln.core.client_address); forwarding headers from anyone else are dropped. First in the chain."""

    def refuse(self, request):
        client_address.resolve(request.META, settings.TRUSTED_PROXIES)
        return None


class UploadLimitMiddleware(DualModeMiddleware):
    """A declared Content-Length over KILN_MAX_UPLOAD_BYTES gets 413 without the body being read.

    Bodies without a trustworthy length are cut off by the streaming upload handler instead.
    """

    def refuse(self, request):
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > settings.MAX_UPLOAD_BYTES:
            refusal = upload_too_large()
            return json_error(refusal.message, refusal.error_code, refusal.status_code)
        return None


# The built UI loads only its own bundled scripts and styles and talks only to this origin.
# React sets style properties through the CSSOM, which style-src does not govern.
CONTENT_SECURITY_POLICY = "; ".join([
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data: blob:",
    "font-src 'self' data:",
    "connect-src 'self'",
    "worker-src 'self' blob:",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
])


class ContentSecurityPolicyMiddleware(DualModeMiddleware):
    """A strict Content-Security-Policy (and a no-referrer-leak policy) on every response."""

    def finish(self, response):
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        response.headers.setdefault("Referrer-Policy", "same-origin")
        return response


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    """WhiteNoise (sync only) made async-capable: only a static file's own request leaves the loop."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response=None, settings=settings):
        super().__init__(get_response, settings=settings)
        self.is_async = follow_mode(self, get_response)

    def __call__(self, request):
        if self.is_async:
            return self._acall(request)
        return super().__call__(request)

    def _static_file(self, request):
        return self.find_file(request.path_info) if self.autorefresh else self.files.get(request.path_info)

    async def _acall(self, request):
        static_file = self._static_file(request)
        if static_file is not None:
            return await sync_to_async(self.serve, thread_sensitive=False)(static_file, request)
        return await self.get_response(request)


class RequestMetricsMiddleware(DualModeMiddleware):
    """Request latency per route into /metrics; absent unless KILN_METRICS is on."""

    def __init__(self, get_response):
        if not settings.METRICS:
            raise MiddlewareNotUsed
        super().__init__(get_response)

    def __call__(self, request):
        if self.is_async:
            return self._acall(request)
        started = time.perf_counter()
        return self._observe(request, self.get_response(request), started)

    async def _acall(self, request):
        started = time.perf_counter()
        return self._observe(request, await self.get_response(request), started)

    @staticmethod
    def _observe(request, response, started: float):
        match = getattr(request, "resolver_match", None)
        # The route pattern, never the path: ids in paths would make one series per object.
        route = match.route if match is not None else "unmatched"
        metrics.observe_request(route=route, method=request.method, status=response.status_code, started=started)
        return response


class InlineHeadersMiddleware:
    """Django's SecurityMiddleware, CommonMiddleware and XFrameOptionsMiddleware, run on the event loop.

    Django runs each of them through a thread hop under ASGI; they do no I/O, so for the agent's
    hot routes (kiln.core.asgi.AGENT_ROUTE_MIDDLEWARE) they run inline, in the same order and
    with the same redirects and headers.
    """

    sync_capable = False
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.inner = [SecurityMiddleware(get_response), CommonMiddleware(get_response), XFrameOptionsMiddleware(get_response)]
        markcoroutinefunction(self)

    async def __call__(self, request):
        entered, response = [], None
        for middleware in self.inner:
            entered.append(middleware)
            response = middleware.process_request(request) if hasattr(middleware, "process_request") else None
            if response is not None:
                break
        if response is None:
            response = await self.get_response(request)
        for middleware in reversed(entered):
            if hasattr(middleware, "process_response"):
                response = middleware.process_response(request, response)
        return response
