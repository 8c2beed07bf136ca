"""Backing services restarted under load, with real processes: Redis while a variant build runs,
PostgreSQL while agents long-poll. Both are our own throwaway servers (never the shared ones); the
ASGI server, the Celery worker and the agents point at them and carry on without a manual step."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from django.conf import settings

from kiln.core.management.commands.up import web_server_command
from kiln.pipeline.models import Artifact, ArtifactKind, DeviceTask, DeviceTaskStatus, Variant, VariantStatus
from tests.conftest import REPO, LiveStack, _database_url_for_children, celery_worker_command, wait_until
from tests.e2e.test_pipeline_stack import Api, upload_digits

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REDIS_PORT = 18160
POSTGRES_PORT = 18161
SERVER_PORT = 18162
PRECISIONS = ["fp16", "fp32", "int8-dynamic"]
# The stack's short intervals, for processes that read them from the environment.
STACK_ENV = {
    "KILN_AGENT_LEASE_SECONDS": "8", "KILN_AGENT_HEARTBEAT_SECONDS": "2", "KILN_AGENT_LONG_POLL_SECONDS": "5",
    "KILN_AGENT_OFFLINE_AFTER_SECONDS": "30", "KILN_BENCHMARK_MIN_RUNS": "20", "KILN_BENCHMARK_MIN_SECONDS": "0.3",
    "KILN_BENCHMARK_WARMUP_RUNS": "3", "KILN_BENCHMARK_WARMUP_SECONDS": "0.05", "KILN_HOUSEKEEPING_SECONDS": "1",
    # A build message lost with the broker's memory is sent again once its offered lease lapses.
    "KILN_WORK_LEASE_SECONDS": "3", "KILN_WORK_QUEUE_GRACE_SECONDS": "20",
}


class OwnRedis:
    """A redis-server of our own, without persistence: a restart forgets every queued message."""

    def __init__(self, log: Path):
        self.log = log
        self.url = f"redis://127.0.0.1:{REDIS_PORT}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(["redis-server", "--port", str(REDIS_PORT), "--bind", "127.0.0.1", "--save", "",
                                             "--appendonly", "no", "--daemonize", "no"], stdout=out, stderr=subprocess.STDOUT)
        wait_until(self.ping, timeout=20, interval=0.1, message="our redis-server")

    def ping(self) -> bool:
        import redis

        try:
            return redis.Redis(port=REDIS_PORT, socket_connect_timeout=1).ping()
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=20)


@pytest.fixture
def own_redis(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed here")
    server = OwnRedis(tmp_path / "redis.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _postgres_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return found[-1].parent if found else None


class OwnPostgres:
    """A throwaway PostgreSQL cluster in a temporary folder, run by the `postgres` user when we are root."""

    def __init__(self, bin_dir: Path, root: Path):
        self.bin_dir = bin_dir
        self.root = root
        self.data = root / "data"
        self.url = f"postgres://postgres@127.0.0.1:{POSTGRES_PORT}/kiln"

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        return subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=120)

    def init(self) -> str | None:
        """None once the cluster is created and running; otherwise why it could not be."""
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        result = self._run(str(self.bin_dir / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres")
        if result.returncode != 0:
            return f"initdb failed: {result.stderr.strip()[-400:]}"
        self.pg_ctl("start")
        created = self._run(str(self.bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(POSTGRES_PORT), "-U", "postgres", "kiln")
        return None if created.returncode == 0 else f"createdb failed: {created.stderr.strip()}"

    def pg_ctl(self, action: str) -> None:
        result = self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"), "-w",
                           "-m", "fast", "-o", f"-p {POSTGRES_PORT} -k {self.root} -c listen_addresses=127.0.0.1", action)
        assert result.returncode == 0, (action, result.stdout, result.stderr)


@pytest.fixture
def own_postgres(tmp_path_factory):
    bin_dir = _postgres_bin()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server binaries under /usr/lib/postgresql")
    cluster = OwnPostgres(bin_dir, Path(tmp_path_factory.mktemp("pg")))
    problem = cluster.init()
    if problem:
        pytest.skip(f"cannot run a throwaway PostgreSQL cluster here: {problem}")
    try:
        yield cluster
    finally:
        cluster.pg_ctl("stop")


@dataclass
class ServerStack:
    """The ASGI server (as `make up` runs it), a Celery worker and agents, all in their own processes."""

    stack: LiveStack

    @classmethod
    def start(cls, tmp_path: Path, *, database_url: str, redis_url: str) -> ServerStack:
        env = {**os.environ, **STACK_ENV, "DATABASE_URL": database_url, "REDIS_URL": redis_url, "KILN_DB_POOL_SIZE": "4",
               "KILN_DATA_DIR": str(settings.DATA_DIR), "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "platform")])}
        env.pop("CELERY_BROKER_URL", None)
        stack = LiveStack(url=f"http://127.0.0.1:{SERVER_PORT}", env=env, log_dir=tmp_path)
        server = stack.spawn("server", web_server_command(Path(sys.executable).parent, bind=f"127.0.0.1:{SERVER_PORT}", workers=1,
                                                          platform_dir=REPO / "platform"))

        def healthy() -> bool:
            assert server.poll() is None, stack.logs()
            try:
                return requests.get(f"{stack.url}/api/v1/health/", timeout=5).status_code == 200
            except requests.RequestException:
                return False

        wait_until(healthy, timeout=60, message="the ASGI server")
        stack.spawn("worker", celery_worker_command(tmp_path / "celerybeat-schedule"))
        return cls(stack)

    def django(self, code: str) -> dict:
        """Run `code` (which sets `out`) in a Django process against this stack's database; returns `out`."""
        script = f"import django, json\ndjango.setup()\n{code}\nprint(json.dumps(out))"
        result = subprocess.run([sys.executable, "-c", script], env={**self.stack.env, "DJANGO_SETTINGS_MODULE": "kiln.settings"},
                                cwd=REPO, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout.strip().splitlines()[-1])


def assert_each_variant_built_once(job_id: int) -> None:
    variants = list(Variant.objects.filter(job_id=job_id))
    assert sorted(v.precision for v in variants) == PRECISIONS
    for variant in variants:
        assert variant.status == VariantStatus.READY
        assert Artifact.objects.filter(job_id=job_id, kind=ArtifactKind.VARIANT, name__startswith=f"{variant.key}.").count() == 1
        assert DeviceTask.objects.filter(job_id=job_id, variant=variant).count() == 1
    assert not DeviceTask.objects.filter(job_id=job_id).exclude(status=DeviceTaskStatus.SUCCEEDED).exists()


def test_redis_restarted_while_a_variant_builds_the_job_still_completes_with_each_variant_once(transactional_db, own_redis, model_files, tmp_path):
    from tests.conftest import make_tenant

    live = ServerStack.start(tmp_path, database_url=_database_url_for_children(), redis_url=own_redis.url)
    try:
        tenant = make_tenant(username="rhea", organization="Rheas", password="a-long-password-1")
        api = Api(live.stack.url, tenant.token)
        ids = upload_digits(api, model_files)
        live.stack.start_agent(tenant, "board", backends="onnxruntime")
        job = api.post("/api/v1/jobs/", json={"model_version": ids["version"], "precisions": PRECISIONS})
        wait_until(lambda: Variant.objects.filter(job_id=job["id"], status=VariantStatus.BUILDING).exclude(build_lease_owner="").exists(),
                   timeout=180, interval=0.05, message="a variant build to start")
        # Redis goes away mid-build and comes back empty: queued and unacknowledged messages are gone.
        own_redis.stop()
        time.sleep(2)
        own_redis.start()
        finished = api.wait_for_job(job["id"], live.stack, timeout=200)
        assert finished["status"] == "succeeded", (finished["events"], live.stack.logs())
        assert_each_variant_built_once(job["id"])
        # The outage was felt (and survived) by the worker, not slept through.
        assert "Connection to broker lost" in (tmp_path / "worker.log").read_text()
    finally:
        live.stack.stop()
