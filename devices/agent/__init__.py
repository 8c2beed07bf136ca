"""The Kiln device agent: registers with a server, leases device tasks, runs them, reports."""

from __future__ import annotations


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("kiln-agent")
    except Exception:
        return "0.1.0"


AGENT_VERSION = _version()
