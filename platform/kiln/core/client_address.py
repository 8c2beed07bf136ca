"""Who the client is: the one place that decides a request's address (and whether it came over HTTPS).

The socket's peer is the client unless the peer is a reverse proxy the operator named in
KILN_TRUSTED_PROXIES. Only then is `X-Forwarded-For` read, from its right end: each entry a trusted
proxy appended is skipped, and the first address that is not a trusted proxy is the client. Entries
further left were written by the client itself and are never believed. Without trusted proxies the
forwarding headers are dropped, so nothing later (DRF's throttles, logs) can be fooled by them.

The web server must not rewrite the peer address itself (uvicorn does, for 127.0.0.1, unless told
not to): kiln.core.web_worker turns that off, so this module is the only owner.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# Read from a trusted proxy only; any other peer's are dropped.
FORWARDED_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_X_FORWARDED_PROTO")
# Never read (a proxy is configured to send X-Forwarded-For): dropped always, so nothing later relies on them.
UNREAD_HEADERS = ("HTTP_X_REAL_IP", "HTTP_FORWARDED")
# A proxy chain longer than this is not a chain: stop reading there (and bound the work per request).
MAX_HOPS = 32


class InvalidProxyList(ValueError):
    """KILN_TRUSTED_PROXIES holds something that is not an address or a network."""


def parse_trusted_proxies(raw: str) -> tuple[Network, ...]:
    """`10.0.0.0/8, 127.0.0.1, ::1` as networks (a single address is a /32 or /128)."""
    networks = []
    for item in (part.strip() for part in (raw or "").split(",")):
        if not item:
            continue
        if item == "*":
            raise InvalidProxyList("'*' would let every client choose its own address; list the proxies' addresses or networks")
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise InvalidProxyList(f"{item!r} is not an IP address or network (such as 10.0.0.0/8)") from None
    return tuple(networks)


def _address(text: str) -> Address | None:
    text = text.strip()
    if text.startswith("[") and "]" in text:  # [v6]:port
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # v4:port
        text = text.split(":", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _trusted(address: Address | None, proxies: Sequence[Network]) -> bool:
    if address is None:
        return False
    if getattr(address, "ipv4_mapped", None) is not None:
        address = address.ipv4_mapped
    return any(address.version == network.version and address in network for network in proxies)


def client_address(peer: str, forwarded_for: str | None, proxies: Sequence[Network]) -> str:
    """The client's address, given the socket's peer, its X-Forwarded-For and the trusted proxies."""
    peer_address = _address(peer or "")
    if not proxies or not _trusted(peer_address, proxies):
        return peer
    client = str(peer_address)
    for entry in _hops_from_the_right(forwarded_for or ""):
        hop = _address(entry)
        if hop is None:
            # Not an address a proxy would write: everything from here leftwards came from the client.
            break
        client = str(hop)
        if not _trusted(hop, proxies):
            break
    return client


def _hops_from_the_right(header: str) -> Iterable[str]:
    hops = header.rsplit(",", MAX_HOPS)[-MAX_HOPS:]
    return reversed(hops)


def resolve(meta: dict, proxies: Sequence[Network]) -> None:
    """Set META's REMOTE_ADDR to the client and drop forwarding headers nobody trusted may have set."""
    for header in UNREAD_HEADERS:
        meta.pop(header, None)
    peer = meta.get("REMOTE_ADDR") or ""
    if proxies and _trusted(_address(peer), proxies):
        meta["REMOTE_ADDR"] = client_address(peer, meta.get("HTTP_X_FORWARDED_FOR"), proxies)
        return
    for header in FORWARDED_HEADERS:
        meta.pop(header, None)
