"""The agent's configuration file: server URL, agent id and token, server-chosen intervals."""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path

CONFIG_ENV = "KILN_AGENT_CONFIG"
DEFAULT_CONFIG_PATH = Path("~/.config/kiln/agent.json")


class ConfigError(Exception):
    """The configuration file is missing or unusable; the message says what to do."""


@dataclass
class AgentConfig:
    """What `kiln-agent register` learns and `kiln-agent run` needs."""

    server: str
    agent_id: int | str
    agent_token: str
    name: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    heartbeat_interval_s: float = 15.0
    poll_interval_s: float = 5.0
    long_poll_s: float = 20.0
    lease_seconds: float = 120.0


def config_path(explicit: str | os.PathLike | None = None) -> Path:
    """`explicit`, else $KILN_AGENT_CONFIG, else ~/.config/kiln/agent.json."""
    raw = explicit or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH
    return Path(raw).expanduser()


def save_config(config: AgentConfig, path: Path) -> Path:
    """Write the file atomically, readable by its owner only (it holds the agent token)."""
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # The secret must never exist with wider permissions, not even for an instant: the
    # temporary file is created 0600 and then renamed over the old one.
    tmp_name = str(path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(asdict(config), handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path


def load_config(path: Path) -> AgentConfig:
    """Read the file written by `kiln-agent register`."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"no agent configuration at {path}: run `kiln-agent register --server URL "
            f"--registration-token TOKEN --name NAME` first (or pass --config / set {CONFIG_ENV})"
        ) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read agent configuration {path}: {exc}") from None
    missing = [key for key in ("server", "agent_id", "agent_token") if not data.get(key)]
    if missing:
        raise ConfigError(f"agent configuration {path} lacks {', '.join(missing)}: register again")
    known = AgentConfig.__dataclass_fields__
    return AgentConfig(**{key: value for key, value in data.items() if key in known})
