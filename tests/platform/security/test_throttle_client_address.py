"""The credentials throttle counts the real client: the socket's peer, or what a proxy named in
KILN_TRUSTED_PROXIES says the client was, never what the client says about itself; in a cache that
every server process shares."""
from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from kiln.core.client_address import client_address, parse_trusted_proxies
from tests.conftest import make_tenant

pytestmark = pytest.mark.django_db

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def three_per_minute(settings):
    # DRF reads the rates once into the throttle class; patch where it looks.
    from rest_framework.throttling import ScopedRateThrottle

    original = ScopedRateThrottle.THROTTLE_RATES
    ScopedRateThrottle.THROTTLE_RATES = {**original, "credentials": "3/min"}
    yield
    ScopedRateThrottle.THROTTLE_RATES = original


def failed_login(client, **headers):
    return client.post("/api/v1/auth/login/", {"username": "tina", "password": "wrong-guess"}, format="json", **headers).status_code


def test_forged_forwarded_for_does_not_reset_the_count(three_per_minute):
    make_tenant(username="tina", organization="Tina", password="a-long-password-1")
    client = APIClient()
    answers = [failed_login(client, HTTP_X_FORWARDED_FOR=f"203.0.113.{i}") for i in range(6)]
    assert answers[:3] == [400, 400, 400]
    assert answers[3:] == [429, 429, 429]


def test_behind_a_trusted_proxy_the_address_it_appended_is_the_client(three_per_minute, settings):
    settings.TRUSTED_PROXIES = parse_trusted_proxies("127.0.0.1")  # the test client's peer address
    make_tenant(username="tina", organization="Tina", password="a-long-password-1")
    client = APIClient()
    # Each real client is the address the proxy appended: separate buckets.
    first = [failed_login(client, HTTP_X_FORWARDED_FOR=f"6.6.6.6, 198.51.100.{i}") for i in range(3)]
    assert first == [400, 400, 400]
    # A client forging the first entry while coming through the proxy from one address is one bucket.
    forged = [failed_login(client, HTTP_X_FORWARDED_FOR=f"10.0.0.{i}, 198.51.100.7") for i in range(4)]
    assert forged == [400, 400, 400, 429]


def test_counts_are_shared_between_processes(three_per_minute, settings):
    """Another server process records attempts from 127.0.0.1; this process sees them."""
    make_tenant(username="tina", organization="Tina", password="a-long-password-1")
    script = (
        "import django, time; django.setup();"
        "from django.core.cache import cache;"
        "cache.set('throttle_credentials_127.0.0.1', [time.time()] * 3, 60)"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "kiln.settings", "KILN_DATA_DIR": str(settings.DATA_DIR),
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "platform")])}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)
    assert failed_login(APIClient()) == 429


PROXIES = parse_trusted_proxies("10.0.0.0/8, 2001:db8::1")


@pytest.mark.parametrize(("peer", "forwarded_for", "client"), [
    # No trusted proxy in front: the peer, whatever the header says.
    ("203.0.113.5", "1.2.3.4", "203.0.113.5"),
    # Through one trusted proxy: the entry it appended (the right end); the client's own entries are ignored.
    ("10.0.0.2", "1.2.3.4, 198.51.100.9", "198.51.100.9"),
    # Through two trusted proxies: the first untrusted address from the right.
    ("10.0.0.2", "1.2.3.4, 198.51.100.9, 10.0.0.7", "198.51.100.9"),
    # Ports and IPv6 as proxies write them.
    ("10.0.0.2", "[2001:db8::9]:4711", "2001:db8::9"),
    ("2001:db8::1", "198.51.100.9:1234", "198.51.100.9"),
    ("::ffff:10.0.0.2", "198.51.100.9", "198.51.100.9"),
    # A trusted proxy without the header, or with garbage: the nearest address known to be real.
    ("10.0.0.2", None, "10.0.0.2"),
    ("10.0.0.2", "not-an-address, 10.0.0.8", "10.0.0.8"),
    ("10.0.0.2", "", "10.0.0.2"),
])
def test_the_client_is_the_first_untrusted_hop_from_the_right(peer, forwarded_for, client):
    assert client_address(peer, forwarded_for, PROXIES) == client


def test_a_forwarded_chain_is_read_only_so_far():
    chain = ", ".join(f"10.0.{i // 256}.{i % 256}" for i in range(10_000))
    assert ipaddress.ip_address(client_address("10.0.0.2", chain, PROXIES)) in ipaddress.ip_network("10.0.0.0/8")


def _settings_error(**env: str) -> str:
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "kiln.settings", "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "platform")]), **env}
    result = subprocess.run([sys.executable, "-c", "import django; django.setup()"], env=environment, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    return result.stderr


def test_start_up_refuses_the_old_proxy_count_and_a_wildcard():
    assert "KILN_NUM_PROXIES is replaced by KILN_TRUSTED_PROXIES" in _settings_error(KILN_NUM_PROXIES="1")
    assert "'*' would let every client choose its own address" in _settings_error(KILN_TRUSTED_PROXIES="*")
    assert "'proxy.local' is not an IP address" in _settings_error(KILN_TRUSTED_PROXIES="10.0.0.1, proxy.local")
