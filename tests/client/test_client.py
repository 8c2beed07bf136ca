"""`kiln_client.Client` and the `kiln` command: importable without Django, configured by login, retrying like the agent."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kiln_client.cli import parse_tolerance
from kiln_client.client import Client, ClientConfig
from tests.conftest import REPO


def test_the_client_and_cli_import_without_django():
    # `kiln.Client`, where the server's package is there, is the client's own class (scripts written against it still run).
    code = ("import sys, kiln, kiln_client; assert kiln.Client is kiln_client.Client; import kiln_client.cli; "
            "assert 'django' not in sys.modules, sorted(m for m in sys.modules if 'django' in m)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "platform")])}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)


def test_login_config_is_private_and_env_wins(tmp_path, monkeypatch):
    config = ClientConfig(tmp_path / "kiln" / "client.json")
    config.save(server="http://saved:8000", token="kiln_pat_saved")
    assert oct(config.path.stat().st_mode & 0o777) == "0o600"
    monkeypatch.delenv("KILN_SERVER", raising=False)
    monkeypatch.delenv("KILN_TOKEN", raising=False)
    assert Client(config=config).server == "http://saved:8000"
    monkeypatch.setenv("KILN_SERVER", "http://env:9000/")
    client = Client(config=config)
    assert client.server == "http://env:9000" and client.token == "kiln_pat_saved"
    assert client.url("models/") == "http://env:9000/api/v1/models/"


def test_no_server_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("KILN_SERVER", raising=False)
    with pytest.raises(ValueError, match="kiln login"):
        Client(config=ClientConfig(tmp_path / "none.json"))


@pytest.mark.parametrize(("text", "metric", "expected"), [
    ("1%", "auto", {"metric": "auto", "max_drop": 0.01}),
    ("0.02", "cosine", {"metric": "cosine", "max_drop": 0.02}),
    ("30dB", "sqnr", {"metric": "sqnr", "min_value": 30.0}),
    (None, "accuracy", {"metric": "accuracy"}),
])
def test_tolerance_words(text, metric, expected):
    assert parse_tolerance(text, metric) == expected
