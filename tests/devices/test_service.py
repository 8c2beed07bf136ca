"""`kiln-agent install-service` and `kiln-agent up`: the service files' content and the re-use of a registration."""
from __future__ import annotations

import configparser
import plistlib
import subprocess
import sys
from pathlib import Path

from devices.agent import cli
from devices.agent.config import AgentConfig, save_config
from devices.agent.service import LAUNCHD, SYSTEMD, default_path, enable_hint, launchd_plist, run_command, systemd_unit

REPO = Path(__file__).resolve().parents[2]


def agent_config(tmp_path: Path, server: str = "https://kiln.example") -> Path:
    return save_config(AgentConfig(server=server, agent_id=7, agent_token="kiln_agt_secret", name="rig"), tmp_path / "agent.json")


def test_the_systemd_unit_runs_the_agent_by_absolute_paths_and_restarts_it_except_on_401(tmp_path):
    command = run_command(config=tmp_path / "my config" / "agent.json", work_dir=tmp_path / "work", threads=4)
    unit = configparser.ConfigParser(interpolation=None)
    unit.read_string(systemd_unit(command, server="https://kiln.example"))
    exec_start = unit["Service"]["ExecStart"]
    assert exec_start.startswith(f"{sys.executable} -m devices.agent run --config \"{tmp_path}/my config/agent.json\"")
    assert exec_start.endswith(f"--work-dir {tmp_path}/work --threads 4")
    assert unit["Service"]["Restart"] == "on-failure"
    assert unit["Service"]["RestartPreventExitStatus"] == str(cli.EXIT_UNAUTHORIZED)
    assert unit["Unit"]["After"] == "network-online.target"
    assert unit["Install"]["WantedBy"] == "default.target"
    assert "https://kiln.example" in unit["Unit"]["Description"]


def test_a_percent_sign_in_a_path_is_not_a_systemd_specifier(tmp_path):
    unit = systemd_unit(run_command(config=tmp_path / "50%" / "agent.json", work_dir=tmp_path), server="s")
    assert "/50%%/agent.json" in unit


def test_the_launchd_agent_is_a_valid_plist_with_the_same_command(tmp_path):
    command = run_command(config=tmp_path / "agent.json", work_dir=tmp_path / "work")
    plist = plistlib.loads(launchd_plist(command, log_path=tmp_path / "agent.log").encode())
    assert plist["ProgramArguments"] == command
    assert plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["StandardErrorPath"] == str(tmp_path / "agent.log")


def test_services_default_to_per_user_locations_that_need_no_root(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert default_path(SYSTEMD) == tmp_path / "systemd" / "user" / "kiln-agent.service"
    assert default_path(LAUNCHD).name == "dev.kiln.agent.plist"
    assert enable_hint(SYSTEMD, default_path(SYSTEMD)) == "systemctl --user daemon-reload && systemctl --user enable --now kiln-agent"
    assert enable_hint(SYSTEMD, tmp_path / "elsewhere.service").endswith(f"enable --now {tmp_path}/elsewhere.service")


def test_install_service_print_shows_the_unit_and_writes_nothing(tmp_path):
    config = agent_config(tmp_path)
    target = tmp_path / "units" / "kiln-agent.service"
    shown = subprocess.run([sys.executable, "-m", "devices.agent", "install-service", "--kind", "systemd", "--print",
                            "--config", str(config), "--work-dir", str(tmp_path / "work"), "--path", str(target)],
                           cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    assert "ExecStart=" in shown.stdout and f"--config {config}" in shown.stdout
    assert "Description=Kiln device agent for https://kiln.example" in shown.stdout
    assert not target.exists()


def test_install_service_writes_the_unit_and_says_how_to_start_it(tmp_path):
    config = agent_config(tmp_path)
    target = tmp_path / "units" / "kiln-agent.service"
    written = subprocess.run([sys.executable, "-m", "devices.agent", "install-service", "--kind", "systemd",
                              "--config", str(config), "--work-dir", str(tmp_path / "work"), "--path", str(target)],
                             cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    assert target.read_text() == systemd_unit(run_command(config=config, work_dir=tmp_path / "work"), server="https://kiln.example")
    assert f"systemctl --user enable --now {target}" in written.stdout


def test_install_service_without_a_registration_says_to_register_first(tmp_path):
    answer = subprocess.run([sys.executable, "-m", "devices.agent", "install-service", "--config", str(tmp_path / "none.json"),
                             "--path", str(tmp_path / "unit.service")], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert answer.returncode == cli.EXIT_USAGE
    assert "run `kiln-agent register`" in answer.stderr
    assert not (tmp_path / "unit.service").exists()


def test_up_reuses_a_registration_with_the_same_server_and_not_another_one(tmp_path):
    config = agent_config(tmp_path, "https://kiln.example/")
    assert cli.registered_config(config, "https://kiln.example").agent_id == 7
    assert cli.registered_config(config, "https://other.example") is None
    assert cli.registered_config(tmp_path / "missing.json", "https://kiln.example") is None


def test_up_install_service_on_a_registered_machine_writes_the_service_without_contacting_the_server(tmp_path):
    # The server URL answers nothing: a registration attempt would fail with a network error.
    config = agent_config(tmp_path, "http://127.0.0.1:9")
    target = tmp_path / "unit.service"
    answer = subprocess.run([sys.executable, "-m", "devices.agent", "up", "--server", "http://127.0.0.1:9", "--config", str(config),
                             "--install-service", "--service-path", str(target)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert answer.returncode == 0, answer.stderr
    assert "already registered" in answer.stdout
    assert f"--config {config}" in target.read_text()
