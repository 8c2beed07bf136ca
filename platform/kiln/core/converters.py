"""Path converters: ids in URLs fit the database's 64-bit keys or match no route (404)."""
from __future__ import annotations


class IdConverter:
    """A positive id of at most 18 digits; a longer number is not an id of ours, so no route
    matches and the answer is a JSON 404 instead of a database overflow."""

    regex = "[0-9]{1,18}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value) -> str:
        return str(int(value))
