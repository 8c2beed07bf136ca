"""JSON request bodies with limits: size per route, nesting depth, and numbers that fit.

DRF's own JSONParser reads the whole stream (Django's DATA_UPLOAD_MAX_MEMORY_SIZE does not apply
to it), lets Python's parser recurse until RecursionError, and turns `1e400` into infinity; each
of those became a 500 or a stored nonsense value. This parser refuses them as 4xx first.
"""
from __future__ import annotations

import json
import math

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from .errors import RequestTooLarge

# Deeper than any body Kiln's API or agent protocol defines (the deepest is about 6).
MAX_JSON_DEPTH = 32
# Integers travel as 64-bit ids and counts; anything larger is a hostile or broken client.
MAX_JSON_INTEGER = 2**63 - 1


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 19:
        raise ValueError(f"integer {text[:40]}… is out of range")
    value = int(text)
    if abs(value) > MAX_JSON_INTEGER:
        raise ValueError(f"integer {text} is out of range")
    return value


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def json_depth(value) -> int:
    """Nesting depth of parsed JSON (a scalar is 0), computed without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def parse_bounded_json(raw: bytes, *, encoding: str = "utf-8"):
    """Decode a JSON body or raise ParseError (400) saying what is wrong with it."""
    try:
        data = json.loads(raw.decode(encoding), parse_float=_finite_float, parse_int=_bounded_int, parse_constant=_reject_constant)
    except RecursionError:
        raise ParseError(f"JSON nested too deeply (at most {MAX_JSON_DEPTH} levels).")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ParseError(f"JSON parse error: {exc}")
    if json_depth(data) > MAX_JSON_DEPTH:
        raise ParseError(f"JSON nested too deeply (at most {MAX_JSON_DEPTH} levels).")
    return data


class BoundedJSONParser(JSONParser):
    """JSON bodies up to KILN_MAX_JSON_BYTES; subclasses name another limit for their routes."""

    limit_setting = "MAX_JSON_BYTES"
    limit_variable = "KILN_MAX_JSON_BYTES"

    def parse(self, stream, media_type=None, parser_context=None):
        limit = getattr(settings, self.limit_setting)
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise RequestTooLarge(f"The JSON body is larger than this route's limit of {limit // 1024} KiB ({self.limit_variable}).")
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        return parse_bounded_json(raw, encoding=encoding)


class AgentResultJSONParser(BoundedJSONParser):
    """Task results carry metrics, a per-operator profile and the tail of the agent's log."""

    limit_setting = "MAX_AGENT_RESULT_BYTES"
    limit_variable = "KILN_MAX_AGENT_RESULT_BYTES"
