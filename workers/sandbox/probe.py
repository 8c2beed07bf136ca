"""Escape attempts a confined child makes on itself, so that a host can show what its sandbox really stops.

Run by `runner.probe()` (for `manage.py sandbox`, the health endpoint and `make up`'s banner) and by the
tests, which give it a file it must not read, a folder it must not write and a port it must not reach.
Each attempt answers "refused" (with the error) or "ALLOWED".
"""
from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path


def _attempt(action: Callable[[], object]) -> str:
    try:
        action()
    except Exception as error:  # any failure is a refusal; which error says which layer stopped it
        return f"refused ({type(error).__name__}: {getattr(error, 'strerror', None) or error})"
    return "ALLOWED"


def _connect(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def _write_outside(folder: str) -> None:
    target = Path(folder) / f"escaped-{os.getpid()}"
    target.write_text("escaped")


def escapes(request: dict, work: Path) -> dict:
    """Try each escape the request names; report what happened."""
    targets = request.get("targets", {})
    tried = {
        "read a host file": lambda: Path(targets.get("secret_file", "/etc/os-release")).read_bytes(),
        "write outside its folder": lambda: _write_outside(targets.get("outside_folder", "/tmp")),
        "run a program": lambda: subprocess.run(["/bin/sh", "-c", "true"], check=True, timeout=5),
        "signal the server": lambda: os.kill(int(targets["server_pid"]), 0),
    }
    if targets.get("port"):
        tried["open a connection"] = lambda: _connect(int(targets["port"]))
    else:
        tried["open a socket"] = lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
    return {"escapes": {name: _attempt(action) for name, action in tried.items()}}
