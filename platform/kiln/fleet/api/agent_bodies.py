"""Validated bodies of the agent's hot routes, remembered by their bytes.

An idle agent sends the same heartbeat and lease bodies again and again (and a fleet of one kind
of machine, the same bodies as each other). Validating one through DRF's nested serializers costs
about as much CPU as the rest of the request, and the result depends on the bytes alone; so a
valid body's result is kept (bounded, per process) and served again. The result is shared: read it,
never change it.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

from django.conf import settings

from kiln.core.errors import RequestTooLarge
from kiln.core.parsers import parse_bounded_json

MAX_ENTRIES = 4096
MAX_REMEMBERED_BYTES = 16 * 1024

_lock = threading.Lock()
_validated: OrderedDict[tuple[type, bytes], dict] = OrderedDict()


def read_raw_body(request) -> bytes:
    """The body's bytes, or RequestTooLarge (413) past KILN_MAX_JSON_BYTES."""
    raw = request.read(settings.MAX_JSON_BYTES + 1)
    if len(raw) > settings.MAX_JSON_BYTES:
        raise RequestTooLarge(f"The JSON body is larger than this route's limit of {settings.MAX_JSON_BYTES // 1024} KiB (KILN_MAX_JSON_BYTES).")
    return raw


def body_validate(serializer_class, raw: bytes) -> tuple[dict | None, dict | None]:
    """(validated data, None) or (None, the serializer's errors); ParseError (400) for bad JSON."""
    key = (serializer_class, raw)
    with _lock:
        known = _validated.get(key)
    if known is not None:
        return known, None
    body = parse_bounded_json(raw) if raw else {}
    data = serializer_class(data=body if isinstance(body, dict) else {})
    if not data.is_valid():
        return None, data.errors
    if len(raw) <= MAX_REMEMBERED_BYTES:
        with _lock:
            _validated[key] = data.validated_data
            while len(_validated) > MAX_ENTRIES:
                _validated.popitem(last=False)
    return data.validated_data, None
