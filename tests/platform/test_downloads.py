"""/downloads/: the contract's, the agent's and the client's wheels this server was built with, and nothing else from the folder."""
from __future__ import annotations

import hashlib

import pytest

CONTRACT = "kiln_contract-0.1.0-py3-none-any.whl"
AGENT = "kiln_agent-0.1.0-py3-none-any.whl"
CLIENT = "kiln_client-0.1.0-py3-none-any.whl"


@pytest.fixture
def downloads(settings, tmp_path):
    folder = tmp_path / "dist"
    folder.mkdir()
    for name in (CONTRACT, AGENT, CLIENT, "kiln_server-0.1.0-py3-none-any.whl", "notes.txt", "kiln_agent-0.1.0.tar.gz"):
        (folder / name).write_bytes(f"bytes of {name}".encode())
    (tmp_path / "secret.whl").write_bytes(b"outside")
    settings.DOWNLOADS_DIR = folder
    settings.PUBLIC_URL = ""
    return folder


def test_the_listing_names_only_the_contract_agent_and_client_wheels_with_digests_and_install_commands(client, downloads):
    answer = client.get("/api/v1/downloads/")
    assert answer.status_code == 200
    body = answer.json()
    assert [row["name"] for row in body["files"]] == [CONTRACT, CLIENT, AGENT]
    agent = next(row for row in body["files"] if row["distribution"] == "agent")
    assert agent["sha256"] == hashlib.sha256(f"bytes of {AGENT}".encode()).hexdigest() and agent["version"] == "0.1.0"
    assert agent["url"] == f"http://testserver/downloads/{AGENT}"
    # The agent and the client each with the contract they require, from this server: the client without the agent.
    assert body["install"]["agent"] == f"pip install http://testserver/downloads/{CONTRACT} http://testserver/downloads/{AGENT}"
    assert body["install"]["agent_openvino"] == (f"pip install http://testserver/downloads/{CONTRACT} "
                                                 f'"kiln-agent[openvino] @ http://testserver/downloads/{AGENT}"')
    assert body["install"]["client"] == f"pip install http://testserver/downloads/{CONTRACT} http://testserver/downloads/{CLIENT}"
    assert body["hint"] is None


def test_a_wheel_downloads_without_signing_in(client, downloads):
    answer = client.get(f"/downloads/{AGENT}")
    assert answer.status_code == 200
    assert b"".join(answer.streaming_content) == f"bytes of {AGENT}".encode()
    assert AGENT in answer["Content-Disposition"]


@pytest.mark.parametrize("name", ["kiln_server-0.1.0-py3-none-any.whl", "notes.txt", "kiln_agent-0.1.0.tar.gz", "..%2Fsecret.whl",
                                  "kiln_agent-9.9.9-py3-none-any.whl"])
def test_anything_else_is_not_found(client, downloads, name):
    assert client.get(f"/downloads/{name}").status_code == 404


def test_the_index_page_is_a_find_links_page_with_sha256_fragments(client, downloads):
    page = client.get("/downloads/").content.decode()
    digest = hashlib.sha256(f"bytes of {CLIENT}".encode()).hexdigest()
    assert f'<a href="{CLIENT}#sha256={digest}">' in page
    assert "kiln_server" not in page and "notes.txt" not in page


def test_the_public_url_names_the_server_in_commands(client, downloads, settings):
    settings.PUBLIC_URL = "https://kiln.example.com"
    assert client.get("/api/v1/downloads/").json()["install"]["agent"] == (f"pip install https://kiln.example.com/downloads/{CONTRACT} "
                                                                         f"https://kiln.example.com/downloads/{AGENT}")


def test_without_wheels_it_says_how_to_build_them(client, settings, tmp_path):
    settings.DOWNLOADS_DIR = tmp_path / "nothing-here"
    body = client.get("/api/v1/downloads/").json()
    assert body["files"] == [] and body["install"] is None and "make wheels" in body["hint"]
