"""The credentials throttle counts the real client (proxy depth from KILN_NUM_PROXIES), in a cache
that every server process shares."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rest_framework.settings import api_settings
from rest_framework.test import APIClient

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


def test_one_proxy_means_the_last_forwarded_address_is_the_client(three_per_minute, monkeypatch):
    monkeypatch.setattr(api_settings, "NUM_PROXIES", 1)
    make_tenant(username="tina", organization="Tina", password="a-long-password-1")
    client = APIClient()
    # Behind one proxy, each real client is the address the proxy appended: separate buckets.
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
