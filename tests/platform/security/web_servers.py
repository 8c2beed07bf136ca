"""Real web servers for the hostile-input tests: gunicorn with Kiln's uvicorn workers, as `make up` runs them.

Each server is its own process tree on its own port, sharing this test's database, cache and
data folder, so that what one server process remembers (a token cache, a throttle count) is
really per process and what they share is really shared.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import requests
from django.conf import settings

from kiln.core.management.commands.up import web_server_command
from tests.conftest import REPO, _database_url_for_children, wait_until


class WebServer:
    def __init__(self, url: str, process: subprocess.Popen, log: Path):
        self.url, self.process, self.log = url, process, log

    def get(self, path: str, **kwargs) -> requests.Response:
        return requests.get(f"{self.url}{path}", timeout=30, **kwargs)

    def post(self, path: str, **kwargs) -> requests.Response:
        return requests.post(f"{self.url}{path}", timeout=30, **kwargs)

    def patch(self, path: str, **kwargs) -> requests.Response:
        return requests.patch(f"{self.url}{path}", timeout=30, **kwargs)


def _stop(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextmanager
def web_server(port: int, log: Path, **env: str):
    """A running server on 127.0.0.1:`port` with these extra environment variables; stopped on exit."""
    environment = {
        **{key: value for key, value in os.environ.items() if not key.startswith("KILN_") or key == "KILN_DATA_DIR"},
        "DATABASE_URL": _database_url_for_children(),
        "KILN_DATA_DIR": str(settings.DATA_DIR),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "platform")]),
        **env,
    }
    command = web_server_command(Path(sys.executable).parent, bind=f"127.0.0.1:{port}", workers=1, platform_dir=REPO / "platform")
    with open(log, "ab") as out:
        process = subprocess.Popen(command, env=environment, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = WebServer(f"http://127.0.0.1:{port}", process, log)

    def healthy() -> bool:
        assert process.poll() is None, log.read_text()
        try:
            return server.get("/api/v1/health/").status_code == 200
        except (requests.ConnectionError, requests.Timeout):
            return False

    try:
        wait_until(healthy, timeout=90, message=f"the web server on port {port}")
        yield server
    finally:
        _stop(process)
