"""Text a user reads about their file, without the server's memory addresses (`<function load at 0x7f…>`).

A library's message may name Python objects by their repr, which carries a heap address: a detail of the server's
process that helps an attacker (ASLR) and nobody else. The sandbox's child and runner pass every message through here.
"""
from __future__ import annotations

import re

_REPR = re.compile(r"<([^<>]*?)(?: object)? at 0x[0-9a-fA-F]+>")
_NOTE = re.compile(r"\s*\([^()]*\bat:? 0x[0-9a-fA-F]+\)")
_BARE = re.compile(r"\b0x[0-9a-fA-F]{6,}\b")


def without_addresses(text: str) -> str:
    """`<function load at 0x7f…>` -> `function load`; `(of Python compilation unit at: 0x…)` dropped; any other long hex address elided."""
    return _BARE.sub("0x…", _NOTE.sub("", _REPR.sub(r"\1", text)))
