"""The device set-up the Devices page shows: the server's address as a device reaches it, and the agent's install."""
from __future__ import annotations

import ipaddress
import socket

import pytest
from rest_framework.test import APIClient

from kiln.fleet.setup import is_loopback

pytestmark = pytest.mark.django_db


def test_a_loopback_address_is_flagged_and_the_commands_carry_the_requests_host(tenant):
    body = tenant.client.get("/api/v1/agents/setup/", HTTP_HOST="127.0.0.1:8000").json()
    assert body["server_url"] == "http://127.0.0.1:8000" and body["source"] == "request"
    assert body["loopback"] is True
    assert "on a device it means the device itself" in body["warning"] and "KILN_PUBLIC_URL" in body["warning"]
    assert all(not is_loopback(url) for url in body["suggested_urls"])
    assert body["downloads_url"] == "http://127.0.0.1:8000/downloads/"
    assert body["install_command"] == "pip install --find-links http://127.0.0.1:8000/downloads/ kiln-agent onnxruntime"
    assert [runtime["name"] for runtime in body["runtimes"]] == ["onnxruntime", "openvino"]


def test_kiln_public_url_wins_and_is_not_flagged(tenant, settings):
    settings.PUBLIC_URL = "https://kiln.lab.example"
    body = tenant.client.get("/api/v1/agents/setup/", HTTP_HOST="127.0.0.1:8000").json()
    assert (body["server_url"], body["source"], body["loopback"], body["warning"]) == ("https://kiln.lab.example", "KILN_PUBLIC_URL", False, None)
    assert body["install_command"].startswith("pip install --find-links https://kiln.lab.example/downloads/ ")
    token = tenant.client.post("/api/v1/agents/registration-tokens/", {"name": "lab"}, format="json", HTTP_HOST="127.0.0.1:8000").json()
    assert token["register_command"].startswith("kiln-agent register --server https://kiln.lab.example --registration-token kiln_reg_")


def test_kiln_downloads_url_is_the_one_place_the_install_source_is_set(tenant, settings):
    settings.DOWNLOADS_URL = "https://mirror.lab.example/kiln/"
    body = tenant.client.get("/api/v1/agents/setup/").json()
    assert body["downloads_configured"] is True
    assert body["install_command"] == "pip install --find-links https://mirror.lab.example/kiln/ kiln-agent onnxruntime"


def test_no_runtime_offered_that_the_agent_cannot_run(tenant):
    names = {runtime["name"] for runtime in tenant.client.get("/api/v1/agents/setup/").json()["runtimes"]}
    assert "tensorrt" not in names


@pytest.mark.parametrize("url, loopback", [
    ("http://127.0.0.1:8000", True), ("http://localhost:8000", True), ("http://[::1]:8000", True), ("http://0.0.0.0:8000", True),
    ("http://127.8.9.1", True), ("http://192.168.1.20:8000", False), ("https://kiln.example.com", False), ("http://kiln.localhost", True),
])
def test_loopback_addresses(url, loopback):
    assert is_loopback(url) is loopback


def test_anonymous_gets_no_setup():
    assert APIClient().get("/api/v1/agents/setup/").status_code in (401, 403)


def test_a_loopback_address_is_answered_with_this_machines_own_addresses(tenant):
    """The host name of a Debian machine resolves to 127.0.1.1; the suggestions come from its network interfaces."""
    import psutil

    interfaces = {entry.address for entries in psutil.net_if_addrs().values() for entry in entries if entry.family == socket.AF_INET}
    reachable = {address for address in interfaces if not ipaddress.ip_address(address).is_loopback and not ipaddress.ip_address(address).is_link_local}
    if not reachable:
        pytest.skip("this machine has no network interface but loopback: there is no address to suggest")
    body = tenant.client.get("/api/v1/agents/setup/", HTTP_HOST="127.0.0.1:8000").json()
    assert body["suggested_urls"], "this machine has a network address a device could use"
    assert {url.removeprefix("http://").removesuffix(":8000") for url in body["suggested_urls"]} <= reachable
    assert all(url.startswith("http://") and url.endswith(":8000") for url in body["suggested_urls"])
