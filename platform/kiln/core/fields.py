"""Serializer fields shared by every API: ids and numbers that fit what stores them."""
from __future__ import annotations

import json
import math

from rest_framework import serializers

from .parsers import json_depth

MAX_ID = 2**63 - 1


def id_field(**kwargs) -> serializers.IntegerField:
    """A primary key sent by a client: positive and within the database's 64-bit keys."""
    return serializers.IntegerField(min_value=1, max_value=MAX_ID, **kwargs)


class TruncatedCharField(serializers.CharField):
    """Free text from a machine (errors, logs, progress messages): kept, but cut to `max_chars`
    (the tail by default, where a log's last lines and an error's cause are), never refused."""

    def __init__(self, *, max_chars: int, keep: str = "tail", **kwargs):
        self.max_chars = max_chars
        self.keep = keep
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if isinstance(data, str) and len(data) > self.max_chars:
            data = data[-self.max_chars :] if self.keep == "tail" else data[: self.max_chars]
        return super().to_internal_value(data)


class BoundedJSONField(serializers.JSONField):
    """Free-form JSON with limits: an object, at most `max_bytes` encoded and `max_depth` deep,
    strings of at most `max_string` characters, numbers finite."""

    default_error_messages = {
        "not_object": "Expected a JSON object.",
        "too_large": "At most {max_bytes} bytes of JSON.",
        "too_deep": "At most {max_depth} levels of nesting.",
        "long_string": "Strings are at most {max_string} characters.",
        "not_finite": "Numbers must be finite.",
    }

    def __init__(self, *, max_bytes: int, max_depth: int = 8, max_string: int = 4096, **kwargs):
        self.max_bytes, self.max_depth, self.max_string = max_bytes, max_depth, max_string
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        data = super().to_internal_value(data)
        if not isinstance(data, dict):
            self.fail("not_object")
        if json_depth(data) > self.max_depth:
            self.fail("too_deep", max_depth=self.max_depth)
        for leaf in _leaves(data):
            if isinstance(leaf, str) and len(leaf) > self.max_string:
                self.fail("long_string", max_string=self.max_string)
            if isinstance(leaf, float) and not math.isfinite(leaf):
                self.fail("not_finite")
        if len(json.dumps(data, separators=(",", ":"))) > self.max_bytes:
            self.fail("too_large", max_bytes=self.max_bytes)
        return data


def _leaves(value):
    """Every scalar and every key in parsed JSON, without recursion."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        else:
            yield node
