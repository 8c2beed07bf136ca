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
    """Where the server offers the contract, agent and client wheels: `KILN_DOWNLOADS_URL`, else `<server>/downloads/`."""
    return settings.DOWNLOADS_URL or f"{server}/downloads/"


def install_command(downloads: str, runtime: str = "onnxruntime") -> str:
    return f"pip install --find-links {downloads} {settings.AGENT_DISTRIBUTION} {runtime}"


def register_command(server: str, secret: str) -> str:
    return f"kiln-agent register --server {server} --registration-token {secret} --name $(hostname)"


# Interfaces of containers and VMs on this machine: their addresses are reachable from this machine only, so last.
_VIRTUAL_INTERFACES = ("docker", "br-", "veth", "virbr", "cni", "flannel", "podman", "lxc")


def _interface_addresses() -> list[tuple[str, str]]:
    """(interface, IPv4 address) of every interface of this machine."""
    import psutil

    try:
        interfaces = psutil.net_if_addrs()
    except OSError:
        return []
    return [(name, entry.address) for name, entries in interfaces.items() for entry in entries if entry.family == socket.AF_INET]


def _hostname_addresses() -> list[tuple[str, str]]:
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    except OSError:
        return []
    return [("", info[4][0]) for info in infos]


def _own_addresses() -> list[str]:
    """This machine's IPv4 addresses a device could reach, best first (a hint, never trusted for anything).

    From the network interfaces: the host name alone often resolves to 127.0.1.1 only (Debian's /etc/hosts),
    which left the loopback warning with no address to offer. Loopback and link-local addresses are left out,
    container and VM bridges go last.
    """
    found: list[tuple[bool, str]] = []
    for interface, address in [*_interface_addresses(), *_hostname_addresses()]:
        parsed = ipaddress.ip_address(address)
        if parsed.is_loopback or parsed.is_link_local or parsed.is_unspecified or any(address == known for _, known in found):
            continue
        found.append((interface.startswith(_VIRTUAL_INTERFACES), address))
    return [address for _, address in sorted(found, key=lambda entry: entry[0])][:MAX_SUGGESTED_ADDRESSES]


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
