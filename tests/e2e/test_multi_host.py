"""Kiln on several hosts, as it runs in production: two web hosts behind a load balancer, two Celery
worker hosts and a beat, one PostgreSQL, one Redis and one S3 store; each host with a data folder of
its own (nothing shared but the three services and the configuration). Agents reach the web hosts
through the balancer, spread over both; one web host is killed mid-run."""
from __future__ import annotations

import os
import re
import signal
import socket
import sys
from pathlib import Path

import pytest
import requests
from django.conf import settings
from django.db import connection

from kiln.core.management.commands.up import web_server_command
from kiln.pipeline.models import (
    TERMINAL_TASK_STATUSES,
    Artifact,
    ArtifactKind,
    DeviceTask,
    DeviceTaskPurpose,
    DeviceTaskStatus,
    JobEvent,
    Variant,
    VariantStatus,
)
from tests.conftest import REPO, SHORT_MEASUREMENT_ENV, LiveStack, _database_url_for_children, make_tenant, wait_until
from tests.e2e.test_pipeline_stack import Api, upload_digits
from tests.e2e.test_service_restarts import OwnRedis
from tests.fixtures.balancer import Balancer
from workers.routing import all_queues

pytestmark = [pytest.mark.integration, pytest.mark.timeout(480)]

REDIS_PORT = 18163
PRECISIONS = ["fp16", "fp32", "int8-dynamic"]
AGENTS = 4
# A waiting agent is answered only by a wake-up here: the long-poll and the per-process re-check
# ("probe") are far longer than a wake-up takes, so a wake-up that did not cross hosts shows.
WAKE_WITHIN_S = 10
HOSTS_ENV = {
    "KILN_AGENT_LONG_POLL_SECONDS": "60", "KILN_WAKE_PROBE_SECONDS": "120", "KILN_AGENT_OFFLINE_AFTER_SECONDS": "120",
    "KILN_AGENT_LEASE_SECONDS": "20", "KILN_AGENT_HEARTBEAT_SECONDS": "2", "KILN_HOUSEKEEPING_SECONDS": "1",
    "KILN_BENCHMARK_MIN_RUNS": "20", "KILN_BENCHMARK_MIN_SECONDS": "0.3", "KILN_BENCHMARK_WARMUP_RUNS": "3",
    "KILN_BENCHMARK_WARMUP_SECONDS": "0.05", "KILN_METRICS": "true", "KILN_DB_POOL_SIZE": "4", **SHORT_MEASUREMENT_ENV,
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def shared_redis(tmp_path):
    server = OwnRedis(tmp_path / "redis.log", port=REDIS_PORT)
    try:
        server.start()
    except (FileNotFoundError, AssertionError) as exc:
        pytest.skip(f"cannot run a redis-server of the test's own here: {exc}")
    try:
        yield server
    finally:
        server.stop()


class Hosts:
    """The processes of each host, started through one LiveStack (logs under tmp_path)."""

    def __init__(self, tmp_path: Path, redis_url: str, s3_env: dict):
        shared_secret = tmp_path / "shared"
        shared_secret.mkdir()
        # What every host is given alike (an operator's secrets and service addresses); nothing else is shared.
        env = {key: value for key, value in os.environ.items() if not key.startswith(("KILN_", "CELERY_", "PROMETHEUS_"))}
        env.update(HOSTS_ENV)
        env.update(s3_env, DATABASE_URL=_database_url_for_children(), REDIS_URL=redis_url, PYTHONUNBUFFERED="1",
                   # The keys every host must share (tokens are digests under them); this process makes the test's tokens.
                   KILN_SECRET_KEY=settings.SECRET_KEY, KILN_TOKEN_HMAC_KEY=settings.TOKEN_HMAC_KEY, KILN_PACKAGE_SIGNING_KEY=str(shared_secret / "package-signing-key.pem"),
                   PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "platform")]))
        self.tmp_path = tmp_path
        self.web_ports = {"web-a": free_port(), "web-b": free_port()}
        self.balancer = Balancer([("127.0.0.1", port) for port in self.web_ports.values()])
        self.stack = LiveStack(url=self.balancer.url, env=env, log_dir=tmp_path)
        self.processes = {}

    def host_env(self, host: str) -> dict:
        data = self.tmp_path / host / "data"
        data.mkdir(parents=True, exist_ok=True)
        return {"KILN_DATA_DIR": str(data)}

    def start(self) -> None:
        for host, port in self.web_ports.items():
            self.processes[host] = self.stack.spawn(host, web_server_command(Path(sys.executable).parent, bind=f"127.0.0.1:{port}", workers=1,
                                                                            platform_dir=REPO / "platform"), self.host_env(host))
        for host, port in self.web_ports.items():
            wait_until(lambda port=port, host=host: self.healthy(host, port), timeout=90, message=f"{host} to answer")
        celery = [sys.executable, "-m", "celery", "-A", "workers.celery"]
        for host in ("worker-a", "worker-b"):
            self.processes[host] = self.stack.spawn(host, [*celery, "worker", "--loglevel", "INFO", "--queues", ",".join(all_queues()),
                                                           "--concurrency", "1", "--pool", "solo",
                                                           "--hostname", f"{host}@%h", "--without-heartbeat", "--without-gossip",
                                                           "--without-mingle"], self.host_env(host))
        beat_env = self.host_env("beat")
        self.processes["beat"] = self.stack.spawn("beat", [*celery, "beat", "--loglevel", "INFO", "--schedule",
                                                           str(Path(beat_env["KILN_DATA_DIR"]) / "celerybeat-schedule")], beat_env)

    def healthy(self, host: str, port: int) -> bool:
        assert self.processes[host].poll() is None, self.stack.logs()
        try:
            return requests.get(f"http://127.0.0.1:{port}/api/v1/health/", timeout=5).status_code == 200
        except requests.RequestException:
            return False

    def metric(self, host: str, name: str) -> float:
        """A metric of one web host (its own processes' samples, under its own data folder)."""
        text = requests.get(f"http://127.0.0.1:{self.web_ports[host]}/metrics", timeout=10).text
        found = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    def waiting(self) -> dict[str, float]:
        return {host: self.metric(host, "kiln_agent_lease_waiting") for host in self.web_ports}

    def kill(self, host: str) -> None:
        os.killpg(self.processes[host].pid, signal.SIGKILL)
        self.processes[host].wait(timeout=30)

    def stop(self) -> None:
        self.stack.stop()
        self.balancer.close()


def measure_tasks(job_id: int):
    return DeviceTask.objects.filter(job_id=job_id, purpose=DeviceTaskPurpose.MEASURE)


def first_lease_after_dispatch(job_id: int) -> dict[str, float]:
    """Seconds from the dispatch to each agent's first lease."""
    event = JobEvent.objects.filter(job_id=job_id, message__startswith="Dispatched").order_by("at").first()
    if event is None:
        return {}
    dispatched = event.at
    firsts: dict[str, float] = {}
    for task in measure_tasks(job_id).exclude(started_at=None).select_related("leased_by"):
        waited = (task.started_at - dispatched).total_seconds()
        firsts[task.leased_by.name] = min(firsts.get(task.leased_by.name, waited), waited)
    return firsts


def test_two_web_hosts_two_workers_and_beat_share_one_database_broker_and_store_and_losing_a_web_host_loses_nothing(
        transactional_db, shared_redis, s3_server, model_files, tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("several hosts share one PostgreSQL; this run's database is SQLite (set DATABASE_URL)")
    hosts = Hosts(tmp_path, shared_redis.url, s3_server.env())
    try:
        hosts.start()
        tenant = make_tenant(username="hana", organization="Hosts", password="a-long-password-1")
        api = Api(hosts.balancer.url, tenant.token)
        ids = upload_digits(api, model_files)
        for index in range(AGENTS):
            hosts.stack.start_agent(tenant, f"board-{index}", backends="onnxruntime")
        # Through the balancer the agents' long-polls land on both web hosts.
        wait_until(lambda: sum(hosts.waiting().values()) == AGENTS, timeout=120, message="every agent waiting in a long-poll")
        spread = hosts.waiting()
        assert all(count >= 1 for count in spread.values()), spread

        job = api.post("/api/v1/jobs/", json={"model_version": ids["version"], "precisions": PRECISIONS, "validation_dataset": ids["validation"]})
        wait_until(lambda: len(first_lease_after_dispatch(job["id"])) == AGENTS, timeout=240, interval=0.2,
                   message="every agent to lease its first task")
        # The dispatch ran on a worker host; every waiting agent, on either web host, was woken by it.
        waits = first_lease_after_dispatch(job["id"])
        assert max(waits.values()) < WAKE_WITHIN_S, waits

        def midway() -> bool:
            statuses = list(measure_tasks(job["id"]).values_list("status", flat=True))
            return DeviceTaskStatus.SUCCEEDED in statuses and any(s not in TERMINAL_TASK_STATUSES for s in statuses)

        wait_until(midway, timeout=240, interval=0.1, message="some device tasks done and some not")
        hosts.kill("web-a")

        finished = api.wait_for_job(job["id"], hosts.stack, timeout=300)
        assert finished["status"] == "succeeded", (finished["events"], hosts.stack.logs())
        # Each variant built once, by one of the two workers, and stored once in the shared store.
        variants = list(Variant.objects.filter(job_id=job["id"]).select_related("artifact__blob"))
        assert sorted(v.precision for v in variants) == PRECISIONS
        stored = s3_server.object_keys()
        for variant in variants:
            assert variant.status == VariantStatus.READY and variant.build_attempts == 1, (variant.key, variant.build_attempts)
            assert Artifact.objects.filter(job_id=job["id"], kind=ArtifactKind.VARIANT, name__startswith=f"{variant.key}.").count() == 1
            assert variant.artifact.blob.storage_key in stored
        # Each variant measured once on each agent, every one finished: nothing lost with the host.
        tasks = sorted((t.variant.precision, t.leased_by.name, t.status) for t in measure_tasks(job["id"]).select_related("variant", "leased_by"))
        assert tasks == sorted((p, f"board-{i}", DeviceTaskStatus.SUCCEEDED) for p in PRECISIONS for i in range(AGENTS)), tasks
        # The agents of the dead host reconnected through the balancer: all wait on the other one now.
        wait_until(lambda: hosts.metric("web-b", "kiln_agent_lease_waiting") == AGENTS, timeout=120,
                   message="every agent waiting on the surviving web host")
        assert "Internal Server Error" not in (tmp_path / "web-b.log").read_text(errors="replace")
    finally:
        hosts.stop()
