import os
import stat

import pytest

from devices.agent.config import AgentConfig, ConfigError, config_path, load_config, save_config


def _config() -> AgentConfig:
    return AgentConfig(server="http://kiln.test", agent_id=5, agent_token="kiln_agt_secret",
                       name="box", labels={"arch": "x86"})


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_config_file_is_private(tmp_path):
    path = save_config(_config(), tmp_path / "nested" / "agent.json")
    assert _mode(path) == 0o600


def test_config_file_is_private_when_replacing_a_wider_file(tmp_path):
    path = tmp_path / "agent.json"
    path.write_text("{}")
    path.chmod(0o644)
    save_config(_config(), path)
    assert _mode(path) == 0o600
    assert load_config(path).agent_token == "kiln_agt_secret"


def test_config_round_trips(tmp_path):
    path = save_config(_config(), tmp_path / "agent.json")
    assert load_config(path) == _config()
    assert [p.name for p in tmp_path.iterdir()] == ["agent.json"]


def test_config_path_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_AGENT_CONFIG", str(tmp_path / "env.json"))
    assert config_path("explicit.json").name == "explicit.json"
    assert config_path(None) == tmp_path / "env.json"
    monkeypatch.delenv("KILN_AGENT_CONFIG")
    assert config_path(None) == os.path.expanduser("~/.config/kiln/agent.json") or \
        str(config_path(None)) == os.path.expanduser("~/.config/kiln/agent.json")


def test_missing_config_says_how_to_register(tmp_path):
    with pytest.raises(ConfigError, match="kiln-agent register"):
        load_config(tmp_path / "absent.json")
