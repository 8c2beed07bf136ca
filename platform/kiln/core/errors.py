"""JSON errors with a human message for every failure the API can report."""
from __future__ import annotations

import errno
import logging
import re
import tempfile

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError
from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response

logger = logging.getLogger(__name__)


class KilnError(exceptions.APIException):
    """A domain error that maps to one HTTP status and a machine-readable code."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "invalid"

    def __init__(self, message: str, *, code: str | None = None, status_code: int | None = None, details: dict | None = None):
        super().__init__(detail=message, code=code or self.default_code)
        self.message = message
        self.error_code = code or self.default_code
        if status_code is not None:
            self.status_code = status_code
        self.details = details or {}


class Conflict(KilnError):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"


class UploadTooLarge(KilnError):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "upload_too_large"


class RequestTooLarge(KilnError):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "request_too_large"


def upload_too_large() -> UploadTooLarge:
    limit_mb = settings.MAX_UPLOAD_BYTES / 1024**2
    return UploadTooLarge(f"The upload is larger than this server's limit of {limit_mb:.0f} MB (KILN_MAX_UPLOAD_BYTES).")


def _flatten(detail) -> str:
    if isinstance(detail, dict):
        parts = []
        for key, value in detail.items():
            text = _flatten(value)
            parts.append(text if key in ("non_field_errors", "detail") else f"{key}: {text}")
        return "; ".join(parts)
    if isinstance(detail, list):
        return "; ".join(_flatten(item) for item in detail)
    return str(detail)


def error_body(message: str, code: str, details=None) -> dict:
    body = {"error": message, "code": code}
    if details:
        body["details"] = details
    return body


def exception_handler(exc, context):
    """Render every API exception as `{"error", "code", "details"}`."""
    # Imported here: rest_framework.views imports the authentication classes, which import this module.
    from rest_framework.views import exception_handler as drf_exception_handler

    if isinstance(exc, KilnError):
        return Response(error_body(exc.message, exc.error_code, exc.details), status=exc.status_code)
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(exc.messages)
    if isinstance(exc, DataError):
        # The database refused a value (an id or a count beyond its column): the client's mistake.
        logger.info("database refused a value: %s", exc)
        return Response(error_body("A value in the request is out of range.", "out_of_range"), status=400)
    if isinstance(exc, Http404):
        return Response(error_body("Not found.", "not_found"), status=404)
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        logger.error("storage full: %s", exc)
        return Response(error_body("The server's storage is full; nothing was kept. Try again once space is freed.", "storage_full"), status=507)
    if isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    code = getattr(exc, "default_code", "error")
    if isinstance(exc, exceptions.APIException):
        codes = exc.get_codes()
        code = codes if isinstance(codes, str) else code
    details = response.data if isinstance(exc, exceptions.ValidationError) else None
    response.data = error_body(_flatten(response.data), code, details)
    return response


def json_error(message: str, code: str, status_code: int) -> JsonResponse:
    return JsonResponse(error_body(message, code), status=status_code)


def _server_roots() -> list[str]:
    roots = {str(settings.DATA_DIR), str(settings.UPLOAD_TMP_DIR), str(settings.BLOB_ROOT), tempfile.gettempdir()}
    return sorted(roots, key=len, reverse=True)


def redact_server_paths(message: str, replacements: dict | None = None) -> str:
    """The message with server paths gone: known ones become the user's names for them (an
    upload's temp file → its filename, an extraction folder → nothing, so archive entries read as
    the user wrote them), and anything else under a server folder becomes "…"."""
    text = str(message)
    for path, shown in sorted((replacements or {}).items(), key=lambda item: len(str(item[0])), reverse=True):
        path = str(path)
        if shown == "":
            text = text.replace(path.rstrip("/") + "/", "")
        text = text.replace(path, shown)
    for root in _server_roots():
        text = re.sub(re.escape(root) + r"[^\s'\",:;)\]]*", "…", text)
    return text
