"""Refuse request bodies over the upload limit before anything reads them."""
from __future__ import annotations

from django.conf import settings

from kiln.core.errors import json_error, upload_too_large


class UploadLimitMiddleware:
    """A declared Content-Length over KILN_MAX_UPLOAD_BYTES gets 413 without the body being read.

    Bodies without a trustworthy length are cut off by the streaming upload handler instead.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > settings.MAX_UPLOAD_BYTES:
            refusal = upload_too_large()
            return json_error(refusal.message, refusal.error_code, refusal.status_code)
        return self.get_response(request)


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


class ContentSecurityPolicyMiddleware:
    """A strict Content-Security-Policy (and a no-referrer-leak policy) on every response."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        response.headers.setdefault("Referrer-Policy", "same-origin")
        return response
