"""How a device reaches this server and installs the agent: the one place that builds the set-up commands.

The address is `KILN_PUBLIC_URL` when set, else the host the request came to. A loopback host
(127.0.0.1, localhost, ::1) is what a browser on the server itself uses, and on a device it means the
device: the answer then says so and suggests this machine's own network addresses.
"""
from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings

# The runtimes an agent can run today, as pip installs them (TensorRT is not one yet: README, "Not yet").
AGENT_RUNTIMES = (
    {"name": "onnxruntime", "package": "onnxruntime", "note": "any CPU: x86-64 and aarch64 (Jetson, Raspberry Pi 64-bit), Linux, macOS, Windows"},
    {"name": "openvino", "package": "openvino", "note": "Intel and ARM CPUs; faster INT8 on x86 with VNNI/AMX"},
)
MAX_SUGGESTED_ADDRESSES = 4


def server_url(request) -> tuple[str, str]:
    """The server's address as devices will use it, and where it came from (`KILN_PUBLIC_URL` or `request`)."""
    if settings.PUBLIC_URL:
        return settings.PUBLIC_URL, "KILN_PUBLIC_URL"
    return request.build_absolute_uri("/").rstrip("/"), "request"


def is_loopback(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    if host in ("localhost", "localhost.localdomain") or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def downloads_url(server: str) -> str:
    """Where the server offers the agent and client wheels: `KILN_DOWNLOADS_URL`, else `<server>/downloads/`."""
    return settings.DOWNLOADS_URL or f"{server}/downloads/"


def install_command(downloads: str, runtime: str = "onnxruntime") -> str:
    return f"pip install --find-links {downloads} {settings.AGENT_DISTRIBUTION} {runtime}"


def register_command(server: str, secret: str) -> str:
    return f"kiln-agent register --server {server} --registration-token {secret} --name $(hostname)"


def _own_addresses() -> list[str]:
    """This machine's non-loopback IPv4 addresses, best first (a hint, never trusted for anything)."""
    found: list[str] = []
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    except OSError:
        infos = []
    for info in infos:
        address = info[4][0]
        if not ipaddress.ip_address(address).is_loopback and address not in found:
            found.append(address)
    return found[:MAX_SUGGESTED_ADDRESSES]


def agent_setup(request) -> dict:
    """What the Devices page and `kiln devices setup` show before the device's commands."""
    server, source = server_url(request)
    loopback = is_loopback(server)
    parts = urlsplit(server)
    port = f":{parts.port}" if parts.port else ""
    suggestions = [f"{parts.scheme}://{address}{port}" for address in _own_addresses()] if loopback else []
    warning = None
    if loopback:
        warning = (
            f"{server} is a loopback address: on a device it means the device itself, not this server. "
            "Use an address of this server that the device can reach, serve Kiln on it (e.g. KILN_BIND=0.0.0.0:8000 make up), "
            "and set KILN_PUBLIC_URL to it so that these commands carry it."
        )
    downloads = downloads_url(server)
    return {
        "server_url": server,
        "source": source,
        "loopback": loopback,
        "warning": warning,
        "suggested_urls": suggestions,
        "downloads_url": downloads,
        "downloads_configured": bool(settings.DOWNLOADS_URL),
        "agent_distribution": settings.AGENT_DISTRIBUTION,
        "install_command": install_command(downloads),
        "runtimes": list(AGENT_RUNTIMES),
    }
