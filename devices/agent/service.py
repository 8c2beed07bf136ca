"""Service definitions that keep `kiln-agent run` going: a systemd user unit or a launchd agent.

Written as text so that `kiln-agent install-service --print` can show exactly what would be
installed, without root and without touching the system.
"""

from __future__ import annotations

import os
import plistlib
import sys
from pathlib import Path

SYSTEMD = "systemd"
LAUNCHD = "launchd"
KINDS = (SYSTEMD, LAUNCHD)
SERVICE_NAME = "kiln-agent"
LAUNCHD_LABEL = "dev.kiln.agent"
# `kiln-agent` exits 3 when the server refuses its token; restarting cannot fix that.
EXIT_UNAUTHORIZED = 3


def default_kind() -> str:
    return LAUNCHD if sys.platform == "darwin" else SYSTEMD


def default_path(kind: str) -> Path:
    """Where a per-user service of `kind` lives, so that no root is needed."""
    if kind == LAUNCHD:
        return Path("~/Library/LaunchAgents").expanduser() / f"{LAUNCHD_LABEL}.plist"
    config_home = Path(os.environ.get("XDG_CONFIG_HOME") or Path("~/.config").expanduser())
    return config_home / "systemd" / "user" / f"{SERVICE_NAME}.service"


def run_command(*, config: Path, work_dir: Path, threads: int | None = None) -> list[str]:
    """The agent's `run`, by absolute paths: a service starts with neither a shell nor a PATH."""
    command = [sys.executable, "-m", "devices.agent", "run", "--config", str(Path(config).expanduser().resolve()),
               "--work-dir", str(Path(work_dir).expanduser().resolve())]
    if threads:
        command += ["--threads", str(threads)]
    return command


def _systemd_quote(argument: str) -> str:
    # systemd splits ExecStart on whitespace, honours double quotes and expands % specifiers.
    escaped = argument.replace("%", "%%")
    if escaped and not any(char in escaped for char in ' \t"\'\\;$'):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_unit(command: list[str], *, server: str) -> str:
    exec_start = " ".join(_systemd_quote(argument) for argument in command)
    return (
        "[Unit]\n"
        f"Description=Kiln device agent for {server}\n"
        "Wants=network-online.target\n"
        "After=network-online.target\n"
        "\n"
        "[Service]\n"
        "Type=simple\n"
        f"ExecStart={exec_start}\n"
        "Environment=PYTHONUNBUFFERED=1\n"
        "Restart=on-failure\n"
        "RestartSec=10\n"
        f"RestartPreventExitStatus={EXIT_UNAUTHORIZED}\n"
        "\n"
        "[Install]\n"
        "WantedBy=default.target\n"
    )


def launchd_plist(command: list[str], *, log_path: Path) -> str:
    return plistlib.dumps({
        "Label": LAUNCHD_LABEL,
        "ProgramArguments": command,
        "RunAtLoad": True,
        # Restart after a crash, not after a clean exit (a 401 stops the agent for good).
        "KeepAlive": {"SuccessfulExit": False},
        "ThrottleInterval": 10,
        "EnvironmentVariables": {"PYTHONUNBUFFERED": "1"},
        "StandardOutPath": str(log_path),
        "StandardErrorPath": str(log_path),
    }).decode()


def render(kind: str, command: list[str], *, server: str) -> str:
    if kind == LAUNCHD:
        return launchd_plist(command, log_path=Path("~/Library/Logs/kiln-agent.log").expanduser())
    return systemd_unit(command, server=server)


def enable_hint(kind: str, path: Path) -> str:
    """The one command that starts the installed service now and at every log-in."""
    if kind == LAUNCHD:
        return f"launchctl load -w {path}"
    # A unit outside the user unit directory is enabled by its path (systemd links it).
    unit = path.stem if path.parent == default_path(SYSTEMD).parent else str(path)
    return f"systemctl --user daemon-reload && systemctl --user enable --now {unit}"


def write_service(text: str, path: Path) -> Path:
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
