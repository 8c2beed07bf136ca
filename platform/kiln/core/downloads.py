"""The contract's, the agent's and the client's wheels this server was built with, so that a device installs from the Kiln it
talks to.

    GET /downloads/                 a page of links (pip's --find-links reads it) with the install commands
    GET /downloads/<wheel>          one wheel
    GET /api/v1/downloads/          the same as JSON, for the Devices page: files, sha256s, install commands

Only `kiln_contract-*.whl`, `kiln_agent-*.whl` and `kiln_client-*.whl` in KILN_DOWNLOADS_DIR are served (`make wheels`
and the Docker image put them there); the agent and the client both require kiln-contract. They hold no secret and a device needs them before it has any token, so no sign-in is asked.
"""
from __future__ import annotations

import hashlib
import html
import re
import threading
from pathlib import Path

from django.conf import settings
from django.http import FileResponse, Http404, HttpResponse, JsonResponse

from .serializers import DISTRIBUTIONS, DownloadsSerializer, document

# A wheel of one of the installables a device or a laptop needs; nothing else in the folder is ever served.
WHEEL_NAME = re.compile(rf"^kiln_({'|'.join(DISTRIBUTIONS)})-[0-9][0-9A-Za-z.+!]*-py3-none-any\.whl$")
BUILD_HINT = "No agent or client wheel is built on this server: run `make wheels` (the Docker image builds them)."

_digests: dict[tuple[str, float, int], str] = {}
_lock = threading.Lock()


def _sha256(path: Path) -> str:
    stat = path.stat()
    key = (str(path), stat.st_mtime, stat.st_size)
    with _lock:
        known = _digests.get(key)
    if known:
        return known
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    with _lock:
        _digests[key] = digest.hexdigest()
    return _digests[key]


def wheels() -> list[dict]:
    """The served wheels: name, distribution ("contract", "agent" or "client"), version, size and sha256, newest version first."""
    folder = Path(settings.DOWNLOADS_DIR)
    found = [path for path in folder.glob("kiln_*.whl") if WHEEL_NAME.match(path.name) and path.is_file()] if folder.is_dir() else []
    rows = [{"name": path.name, "distribution": WHEEL_NAME.match(path.name).group(1), "version": path.name.split("-")[1],
             "size_bytes": path.stat().st_size, "sha256": _sha256(path)} for path in found]
    return sorted(rows, key=lambda row: (row["distribution"], row["version"]), reverse=True)


def _base_url(request) -> str:
    return (settings.PUBLIC_URL or request.build_absolute_uri("/").rstrip("/")) + "/downloads/"


def install_commands(rows: list[dict], base: str) -> dict | None:
    """pip commands that install the newest agent (with or without OpenVINO) and the client straight from this server."""
    newest = {}
    for row in rows:
        newest.setdefault(row["distribution"], row)
    if "agent" not in newest or "contract" not in newest:
        return None
    # Each wheel by URL: the kiln-contract requirement of the agent and the client is then met by this server's wheel,
    # never by a namesake elsewhere.
    contract, agent = base + newest["contract"]["name"], base + newest["agent"]["name"]
    commands = {"agent": f"pip install {contract} {agent}", "agent_openvino": f'pip install {contract} "kiln-agent[openvino] @ {agent}"'}
    if "client" in newest:
        commands["client"] = f"pip install {contract} {base + newest['client']['name']}"
    return commands


def downloads_json(request):
    rows = wheels()
    base = _base_url(request)
    return JsonResponse({
        "url": base,
        "files": [{**row, "url": base + row["name"]} for row in rows],
        "install": install_commands(rows, base),
        "hint": None if rows else BUILD_HINT,
    })


document(downloads_json, "get", DownloadsSerializer, "The agent's and the client's wheels, with their install commands; no sign-in.")


def downloads_index(request):
    rows = wheels()
    base = _base_url(request)
    links = "\n".join(f'<li><a href="{html.escape(row["name"])}#sha256={row["sha256"]}">{html.escape(row["name"])}</a> '
                      f'({row["size_bytes"]} bytes)</li>' for row in rows)
    commands = install_commands(rows, base) or {}
    how = "\n".join(f"<pre>{html.escape(command)}</pre>" for command in commands.values())
    body = (f"<!doctype html><html><head><meta charset='utf-8'><title>Kiln downloads</title></head><body>"
            f"<h1>Kiln agent, client and contract</h1><ul>\n{links}\n</ul>{how or '<p>' + html.escape(BUILD_HINT) + '</p>'}</body></html>")
    return HttpResponse(body, content_type="text/html; charset=utf-8")


def download_wheel(request, name: str):
    if not WHEEL_NAME.match(name):
        raise Http404("No such download.")
    path = Path(settings.DOWNLOADS_DIR) / name
    if not path.is_file():
        raise Http404("No such download.")
    return FileResponse(path.open("rb"), as_attachment=True, filename=name, content_type="application/octet-stream")
