"""Refuse request bodies over the upload limit before anything reads them."""
from __future__ import annotations

from django.conf import settings

from kiln.core.errors import json_error


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
            limit_mb = settings.MAX_UPLOAD_BYTES / 1024**2
            return json_error(f"The upload is larger than this server's limit of {limit_mb:.0f} MB (KILN_MAX_UPLOAD_BYTES).", "upload_too_large", 413)
        return self.get_response(request)
