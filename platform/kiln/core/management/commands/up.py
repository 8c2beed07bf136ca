"""Run the whole platform locally: migrate, make a demo account, start web, worker and an agent."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from kiln.accounts.models import Role
from workers.routing import BUILD, CHECK, CONTROL, worker_command
from workers.sandbox.report import granted_names, in_force
from workers.sandbox.runner import SandboxFailed, probe

# uvicorn's worker without its own reading of X-Forwarded-For (see kiln.core.web_worker).
WEB_WORKER_CLASS = "kiln.core.web_worker.UvicornWorker"
DEMO_USERNAME = "demo"
DEMO_ORGANIZATION = "Demo"


def _demo_credentials() -> dict:
    """The demo account's password and token, made once and kept in a 0600 file."""
    path = settings.DATA_DIR / "demo-credentials.json"
    if path.exists():
        return json.loads(path.read_text())
    from django.contrib.auth import get_user_model

    from kiln.accounts.services import api_token_create, membership_ensure, organization_get_or_create
    from kiln.fleet.services import registration_token_create

    password = secrets.token_urlsafe(12)
    user, _ = get_user_model().objects.get_or_create(username=DEMO_USERNAME)
    user.set_password(password)
    user.save()
    organization = organization_get_or_create(name=DEMO_ORGANIZATION)
    membership_ensure(user=user, organization=organization, role=Role.OWNER)
    _, token = api_token_create(user=user, organization=organization, name="make up")
    _, registration = registration_token_create(organization=organization, user=user, name="local agent")
    credentials = {"username": DEMO_USERNAME, "password": password, "token": token, "registration_token": registration}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(credentials, handle)
    return credentials


def sandbox_summary() -> str:
    """The start-up line's account of the sandbox: the confinement in force, what it holds, and whether every escape tried was stopped."""
    try:
        report = probe(uid=settings.SANDBOX_UID)
    except SandboxFailed as failed:
        return f"could not start ({failed})"
    escaped = [name for name, outcome in report["escapes"].items() if not outcome.startswith("refused")]
    granted = ", ".join(granted_names(report["sandbox"])) or "no OS confinement"
    held = f"; NOT stopped: {', '.join(escaped)}" if escaped else "; every escape attempt stopped"
    return f"{granted}{held}; {in_force(report['sandbox'], allow_unconfined=settings.SANDBOX_ALLOW_UNCONFINED)}"


def web_server_command(bin_dir: Path, *, bind: str, workers: int, platform_dir: Path) -> list[str]:
    """Gunicorn supervising uvicorn workers: the ASGI app, so a waiting agent long-poll holds no thread."""
    return [str(bin_dir / "gunicorn"), "kiln.asgi:application", "--worker-class", WEB_WORKER_CLASS,
            "--bind", bind, "--workers", str(workers), "--timeout", "300", "--graceful-timeout", "25", "--chdir", str(platform_dir),
            # Several servers on one machine (tests, other checkouts) must not fight over one control socket.
            "--no-control-socket"]


def worker_commands() -> list[list[str]]:
    """One Celery worker per work class (workers/routing.py): control steps never wait behind a build, and a hostile
    upload's check holds a check slot only. The control worker runs the housekeeping beat."""
    return [
        worker_command(CONTROL, concurrency=1, beat_schedule=settings.DATA_DIR / "celerybeat-schedule"),
        worker_command(BUILD, concurrency=settings.BUILD_SLOTS),
        worker_command(CHECK, concurrency=settings.CHECK_SLOTS),
    ]


def capacity_summary() -> str:
    return (f"{settings.BUILD_SLOTS} build slot(s) of {settings.BUILD_MEMORY_MB} MB, {settings.CHECK_SLOTS} check slot(s); "
            f"per organization {settings.BUILDS_PER_ORGANIZATION} build(s) while others wait, {settings.CHECKS_PER_ORGANIZATION} check(s)")


class Command(BaseCommand):
    help = "Migrate, create the demo account, and run web + Celery worker + a local agent until Ctrl-C."

    def add_arguments(self, parser):
        parser.add_argument("--bind", default=os.environ.get("KILN_BIND", "127.0.0.1:8000"))
        parser.add_argument("--workers", type=int, default=int(os.environ.get("KILN_WEB_WORKERS", "2")), help="Web server processes.")
        parser.add_argument("--no-agent", action="store_true", help="Do not start the local agent.")

    def handle(self, *args, **options):
        call_command("migrate", verbosity=0)
        if settings.METRICS:
            # Samples of processes from an earlier run would be summed into this run's /metrics.
            shutil.rmtree(settings.METRICS_DIR, ignore_errors=True)
            settings.METRICS_DIR.mkdir(parents=True, exist_ok=True)
        credentials = _demo_credentials()
        url = f"http://{options['bind']}"
        repo = settings.REPO_ROOT
        bin_dir = Path(sys.executable).parent
        # The worker and the local agent share one quiet folder: the worker's builds pause while the agent times (devices/quiet.py).
        env = {"KILN_QUIET_DIR": str(settings.DATA_DIR / "quiet"), **os.environ,
               "PYTHONPATH": os.pathsep.join([str(repo), str(repo / "platform")])}
        processes = [
            subprocess.Popen(web_server_command(bin_dir, bind=options["bind"], workers=options["workers"], platform_dir=repo / "platform"),
                             env={"KILN_DB_POOL_SIZE": "8", **env}),
            *[subprocess.Popen(command, env=env, cwd=repo) for command in worker_commands()],
        ]
        if not options["no_agent"]:
            processes.append(self._start_agent(url, credentials, bin_dir, env))
        self.stdout.write(self.style.SUCCESS(f"\nKiln is running at {url}/"))
        self.stdout.write(f"  sign in as {credentials['username']} / {credentials['password']}")
        self.stdout.write(f"  documentation: {url}/docs/")
        self.stdout.write(f"  API docs: {url}/api/docs/")
        self.stdout.write(f"  API token: {credentials['token']}")
        self.stdout.write(f"  devices install the agent from: {url}/downloads/")
        self.stdout.write(f"  command line: .venv/bin/kiln login --server {url} --token {credentials['token']}")
        self.stdout.write(f"  workers: {capacity_summary()}")
        self.stdout.write(f"  model sandbox: {sandbox_summary()} (details: python platform/manage.py sandbox)\n")
        self._wait(processes)

    def _start_agent(self, url: str, credentials: dict, bin_dir: Path, env: dict) -> subprocess.Popen:
        config = settings.DATA_DIR / "agent.json"
        agent_env = {**env, "KILN_AGENT_CONFIG": str(config)}
        if not config.exists():
            # The server must answer before the agent can register.
            self._wait_for(url)
            subprocess.run([str(bin_dir / "kiln-agent"), "register", "--server", url, "--registration-token",
                            credentials["registration_token"], "--name", "local", "--label", "host=local"], env=agent_env, check=True)
        return subprocess.Popen([str(bin_dir / "kiln-agent"), "run", "--work-dir", str(settings.DATA_DIR / "agent-work")], env=agent_env)

    def _wait_for(self, url: str, timeout: float = 60) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{url}/api/v1/health/", timeout=2)
                return
            except OSError:
                time.sleep(0.5)
        raise SystemExit(f"The web server did not answer at {url} within {timeout:.0f} s.")

    def _wait(self, processes: list[subprocess.Popen]) -> None:
        def stop(*_):
            for process in processes:
                if process.poll() is None:
                    process.terminate()
            for process in processes:
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
            raise SystemExit(0)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        while all(process.poll() is None for process in processes):
            time.sleep(1)
        failed = next(p for p in processes if p.poll() is not None)
        self.stderr.write(f"{' '.join(map(str, failed.args[:3]))} exited with {failed.returncode}; stopping.")
        stop()
