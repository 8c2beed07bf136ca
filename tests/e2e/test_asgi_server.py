"""The platform served from ASGI (gunicorn + uvicorn worker, as `make up` runs it): waiting is free.

Agent lease long-polls wait on the event loop: N of them hold neither N threads nor a database
loop, a user's request is answered while they wait (the process re-checks once per probe interval,
not once per waiter), and a notification without an offer (here: a cancel) wakes each waiter once
for one database check.
"""
from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import requests
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler

from kiln.core.management.commands.up import web_server_command
from kiln.fleet.services import agent_register, registration_token_create
from tests.conftest import REPO, _database_url_for_children, make_tenant, upload, wait_until
from workers.celery import app as celery_app

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

PORT = 18110
WAITERS = 40
UPLOAD_LIMIT = 4 * 1024 * 1024


def test_every_middleware_keeps_the_async_path():
    """One sync-only middleware would make every long-poll hold a thread for its whole wait."""
    logger = logging.getLogger("django.request")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        ASGIHandler()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    adapted = [r.getMessage() for r in records if "adapted" in r.getMessage()]
    assert adapted == []


class Server:
    def __init__(self, url: str, process: subprocess.Popen, log: Path):
        self.url, self.process, self.log = url, process, log

    def metric(self, name: str) -> float:
        text = requests.get(f"{self.url}/metrics", timeout=10).text
        found = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.MULTILINE)
        if "{" in name:  # labels given: match them exactly
            found = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    def worker_threads(self) -> int:
        workers = psutil.Process(self.process.pid).children()
        assert len(workers) == 1, workers
        return workers[0].num_threads()


@pytest.fixture
def asgi_server(transactional_db, tmp_path):
    env = {
        **os.environ,
        "DATABASE_URL": _database_url_for_children(),
        "KILN_DATA_DIR": str(settings.DATA_DIR),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "platform")]),
        "KILN_METRICS": "true",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"),
        "KILN_AGENT_LONG_POLL_SECONDS": "60",
        "KILN_DB_POOL_SIZE": "4",
        "KILN_MAX_UPLOAD_BYTES": str(UPLOAD_LIMIT),
    }
    (tmp_path / "metrics").mkdir()
    log = tmp_path / "server.log"
    command = web_server_command(Path(sys.executable).parent, bind=f"127.0.0.1:{PORT}", workers=1, platform_dir=REPO / "platform")
    with open(log, "ab") as out:
        process = subprocess.Popen(command, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(f"http://127.0.0.1:{PORT}", process, log)

    def healthy():
        assert process.poll() is None, log.read_text()
        try:
            return requests.get(f"{server.url}/api/v1/health/", timeout=10).status_code == 200
        except (requests.ConnectionError, requests.Timeout):
            return False

    try:
        wait_until(healthy, timeout=60, message="the ASGI server")
        yield server
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        # The job's validate message was never meant for a worker of a later test.
        celery_app.control.purge()


def test_waiting_long_polls_hold_no_thread_and_no_database_loop_and_a_cancel_wakes_them(asgi_server, model_files):
    tenant = make_tenant(username="waiter", organization="Waiting Lab")
    _, registration = registration_token_create(organization=tenant.organization, user=tenant.user, name="lab")
    tokens = [agent_register(registration_secret=registration, name=f"board-{i}", labels={}, capabilities={"runtimes": {"onnxruntime": "1"}})[1]
              for i in range(WAITERS)]
    version = upload(tenant.client, "/api/v1/models/", model_files["model"]).json()["versions"][0]["id"]
    job = tenant.client.post("/api/v1/jobs/", {"model_version": version, "precisions": ["fp32"]}, format="json").json()

    def long_poll(token: str) -> int:
        return requests.post(f"{asgi_server.url}/api/agent/v1/tasks/lease", json={"wait_s": 55},
                             headers={"Authorization": f"Bearer {token}"}, timeout=90).status_code

    with ThreadPoolExecutor(WAITERS) as pool:
        answers = [pool.submit(long_poll, token) for token in tokens]
        wait_until(lambda: asgi_server.metric("kiln_agent_lease_waiting") == WAITERS, timeout=60, message=f"{WAITERS} waiting long-polls")
        # Each looked at the queue once (a few more while the process's Redis subscription was
        # still connecting, when waiters re-check every second), then sleeps.
        checks = asgi_server.metric("kiln_agent_lease_checks_total")
        assert checks >= WAITERS
        assert asgi_server.worker_threads() < WAITERS // 2

        # A user is answered while every agent waits (a thread-per-request server with fewer
        # threads than waiters would queue this behind them for the long-poll's 55 s).
        jobs = requests.get(f"{asgi_server.url}/api/v1/jobs/", headers={"Authorization": f"Bearer {tenant.token}"}, timeout=15)
        assert jobs.status_code == 200 and jobs.json()["results"][0]["id"] == job["id"]
        assert asgi_server.metric('kiln_http_request_duration_seconds_count{method="GET",route="api/v1/jobs/",status="2xx"}') == 1

        def settled():
            nonlocal checks
            before, _ = checks, time.sleep(1.5)
            checks = asgi_server.metric("kiln_agent_lease_checks_total")
            return checks == before

        wait_until(settled, timeout=30, interval=0, message="the subscription to connect")
        quiet_s = 6
        time.sleep(quiet_s)
        # Waiting costs no database work per waiter: the process re-checks for the longest waiter
        # once per probe interval (a lost wake-up costs seconds), whatever the number of waiters.
        probes = asgi_server.metric("kiln_agent_lease_checks_total") - checks
        assert probes <= quiet_s / settings.WAKE_PROBE_SECONDS + 1, "waiting long-polls queried the database"

        assert asgi_server.metric("kiln_agent_lease_waiting") == WAITERS
        # Waiters that arrived before the subscription was up were woken once when it came up.
        woken = asgi_server.metric("kiln_agent_lease_wakeups_total")
        checks = asgi_server.metric("kiln_agent_lease_checks_total")
        canceled = tenant.client.post(f"/api/v1/jobs/{job['id']}/cancel/")
        assert canceled.status_code == 200
        wait_until(lambda: asgi_server.metric("kiln_agent_lease_wakeups_total") >= woken + WAITERS, timeout=20, message="every waiter woken by the cancel")
        time.sleep(1)
        # Each waiter woke once for one check; at most a probe or two of their own besides.
        assert woken + WAITERS <= asgi_server.metric("kiln_agent_lease_wakeups_total") <= woken + WAITERS + 2
        assert checks + WAITERS <= asgi_server.metric("kiln_agent_lease_checks_total") <= checks + WAITERS + 2
        assert asgi_server.metric("kiln_agent_lease_waiting") == WAITERS
        assert all(not answer.done() for answer in answers)
    assert [answer.result() for answer in answers] == [204] * WAITERS


def test_a_body_over_the_upload_limit_is_refused_under_asgi_too(asgi_server):
    """Django's ASGI handler reads a whole body before any middleware: the limit must hold before that."""
    tenant = make_tenant(username="big", organization="Big Uploads")
    headers = {"Authorization": f"Bearer {tenant.token}"}
    declared = requests.post(f"{asgi_server.url}/api/v1/models/", data=b"x" * (UPLOAD_LIMIT + 1), headers=headers, timeout=30)
    assert declared.status_code == 413 and declared.json()["code"] == "upload_too_large"

    def chunks():
        for _ in range(UPLOAD_LIMIT // 65536 + 2):
            yield b"x" * 65536

    undeclared = requests.post(f"{asgi_server.url}/api/v1/models/", data=chunks(), headers=headers, timeout=30)
    assert undeclared.status_code == 413 and undeclared.json()["code"] == "upload_too_large"
    assert requests.get(f"{asgi_server.url}/api/v1/models/", headers=headers, timeout=10).json()["count"] == 0
