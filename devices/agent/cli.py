"""`kiln-agent`: register this machine with a Kiln server, run the agent (or both: `up`), install it as a
service, show capabilities."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
from pathlib import Path

from devices.agent import AGENT_VERSION
from devices.agent.capabilities import collect_capabilities
from devices.agent.client import AgentClient, AgentUnauthorized, ApiError, ServerUnavailable
from devices.agent.config import AgentConfig, ConfigError, config_path, load_config, save_config
from devices.agent.service import KINDS, default_kind, default_path, enable_hint, render, run_command, write_service

logger = logging.getLogger("devices.agent")

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNAUTHORIZED = 3
WORK_DIR_ENV = "KILN_AGENT_WORK_DIR"
DEFAULT_WORK_DIR = Path("~/.cache/kiln/agent")


def _parse_label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"labels are key=value, got {text!r}")
    return key.strip(), value.strip()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kiln-agent", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kiln-agent {AGENT_VERSION}")
    parser.add_argument("--log-level", default=os.environ.get("KILN_AGENT_LOG_LEVEL", "INFO"),
                        help="DEBUG, INFO, WARNING or ERROR (env KILN_AGENT_LOG_LEVEL)")
    commands = parser.add_subparsers(dest="command", required=True)

    register = commands.add_parser("register", help="register with a server and store the token")
    _add_registration_arguments(register)
    register.add_argument("--config", help="config file (default: $KILN_AGENT_CONFIG or "
                          "~/.config/kiln/agent.json)")

    run = commands.add_parser("run", help="lease and run device tasks until stopped")
    _add_run_arguments(run)
    run.add_argument("--once", action="store_true", help="exit after handling one task")

    up = commands.add_parser("up", help="register (unless this config is already registered with the server) "
                             "and run, in one go")
    _add_registration_arguments(up)
    _add_run_arguments(up)
    up.add_argument("--install-service", action="store_true",
                    help="instead of running in the foreground, install a service that runs the agent "
                    "(systemd user unit, launchd agent on macOS) and print how to start it")
    up.add_argument("--service-path", help="where to write the service file (default: the per-user location)")

    service = commands.add_parser("install-service", help="write a systemd user unit (or launchd agent) that "
                                  "runs `kiln-agent run` at log-in and restarts it after a crash")
    service.add_argument("--kind", choices=KINDS, default=default_kind(),
                         help="systemd or launchd (default: this platform's)")
    service.add_argument("--path", help="where to write it (default: ~/.config/systemd/user/kiln-agent.service "
                         "or ~/Library/LaunchAgents/dev.kiln.agent.plist)")
    service.add_argument("--print", action="store_true", dest="print_only",
                         help="print the service file instead of writing it")
    _add_run_arguments(service)

    commands.add_parser("capabilities", help="print this machine's capabilities as JSON")
    return parser


def _add_registration_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("--server", required=True, help="base URL of the Kiln server")
    command.add_argument("--registration-token", default=os.environ.get("KILN_AGENT_REGISTRATION_TOKEN"),
                         help="a kiln_reg_… token (or env KILN_AGENT_REGISTRATION_TOKEN, which "
                         "keeps it out of the process list)")
    command.add_argument("--name", default=socket.gethostname(), help="agent name (default: hostname)")
    command.add_argument("--label", action="append", default=[], type=_parse_label,
                         metavar="KEY=VALUE", help="a label for targeting; repeatable")


def _add_run_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("--config", help="config file written by `register` (default: $KILN_AGENT_CONFIG or "
                         "~/.config/kiln/agent.json)")
    command.add_argument("--work-dir", help=f"scratch directory for task files (default: "
                         f"${WORK_DIR_ENV} or {DEFAULT_WORK_DIR})")
    command.add_argument("--threads", type=int, default=None,
                         help="inference threads (default: the runtime's choice)")


def _register(args) -> int:
    _register_agent(args)
    return EXIT_OK


def _register_agent(args) -> AgentConfig:
    """Register with the server and save the configuration; the config it wrote."""
    if not args.registration_token:
        raise ConfigError("a registration token is required: --registration-token or "
                          "KILN_AGENT_REGISTRATION_TOKEN (create one under Agents in the web UI)")
    path = config_path(args.config)
    labels = dict(args.label)
    client = AgentClient(args.server)
    answer = client.register(registration_token=args.registration_token, name=args.name,
                             labels=labels, capabilities=collect_capabilities())
    config = AgentConfig(
        server=args.server.rstrip("/"),
        agent_id=answer["agent_id"],
        agent_token=answer["agent_token"],
        name=args.name,
        labels=labels,
        heartbeat_interval_s=float(answer.get("heartbeat_interval_s") or 15.0),
        poll_interval_s=float(answer.get("poll_interval_s") or 5.0),
        long_poll_s=float(answer.get("long_poll_s") or 20.0),
        lease_seconds=float(answer.get("lease_seconds") or 120.0),
    )
    save_config(config, path)
    print(f"registered agent {config.agent_id} ({config.name}) with {config.server}; "
          f"configuration saved to {path}")
    return config


def registered_config(path: Path, server: str) -> AgentConfig | None:
    """The saved configuration when it already belongs to `server`: `up` run again (or by a service) re-uses it."""
    if not path.exists():
        return None
    config = load_config(path)
    return config if config.server.rstrip("/") == server.rstrip("/") else None


def _work_dir(args) -> Path:
    return Path(args.work_dir or os.environ.get(WORK_DIR_ENV) or DEFAULT_WORK_DIR).expanduser()


def _up(args) -> int:
    config = registered_config(config_path(args.config), args.server)
    if config is None:
        _register_agent(args)
    else:
        print(f"agent {config.agent_id} ({config.name}) is already registered with {config.server}; "
              f"using {config_path(args.config)}")
    if args.install_service:
        args.kind, args.path, args.print_only = default_kind(), args.service_path, False
        return _install_service(args)
    args.once = False
    return _run(args)


def _install_service(args) -> int:
    kind = args.kind
    command = run_command(config=config_path(args.config), work_dir=_work_dir(args), threads=args.threads)
    server = load_config(config_path(args.config)).server if config_path(args.config).exists() else "a Kiln server"
    text = render(kind, command, server=server)
    if args.print_only:
        print(text, end="")
        return EXIT_OK
    if not config_path(args.config).exists():
        raise ConfigError(f"no agent configuration at {config_path(args.config)}: run `kiln-agent register` "
                          "(or `kiln-agent up --install-service`) first, so that the service has a token to use")
    path = write_service(text, Path(args.path).expanduser() if args.path else default_path(kind))
    print(f"wrote the {kind} service to {path}; start it now and at every log-in with:\n  {enable_hint(kind, path)}")
    return EXIT_OK


def _run(args) -> int:
    from devices.agent.loop import Agent

    config = load_config(config_path(args.config))
    work_dir = _work_dir(args)
    work_dir.mkdir(parents=True, exist_ok=True)
    agent = Agent(config, work_dir, threads=args.threads)

    def on_signal(signum, frame):
        agent.request_stop(interrupt_idle=True)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    logger.info("kiln-agent %s: agent %s working for %s (runtimes: %s)", AGENT_VERSION,
                config.agent_id, config.server, ", ".join(agent.capabilities["runtimes"]) or "none")
    return agent.run(once=args.once)


def _capabilities(args) -> int:
    print(json.dumps(collect_capabilities(), indent=2, sort_keys=True))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = getattr(logging, str(args.log_level).upper(), logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    # A task's log sent to the server keeps INFO lines even when the console shows less.
    for handler in logging.getLogger().handlers:
        handler.setLevel(level)
    logging.getLogger("devices").setLevel(min(level, logging.INFO))
    handlers = {"register": _register, "run": _run, "up": _up, "install-service": _install_service,
                "capabilities": _capabilities}
    try:
        return handlers[args.command](args)
    except AgentUnauthorized as exc:
        print(f"kiln-agent: the server refused the token (401): {exc.message}", file=sys.stderr)
        return EXIT_UNAUTHORIZED
    except ConfigError as exc:
        print(f"kiln-agent: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (ApiError, ServerUnavailable) as exc:
        print(f"kiln-agent: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
