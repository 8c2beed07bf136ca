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
