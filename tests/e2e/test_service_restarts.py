"""Backing services restarted under load, with real processes: Redis while a variant build runs,
PostgreSQL while agents long-poll. Both are our own throwaway servers (never the shared ones); the
ASGI server, the Celery worker and the agents point at them and carry on without a manual step."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from django.conf import settings

from kiln.core.management.commands.up import web_server_command
from kiln.pipeline.models import Artifact, ArtifactKind, DeviceTask, DeviceTaskStatus, Variant, VariantStatus
from tests.conftest import REPO, SHORT_MEASUREMENT_ENV, LiveStack, _database_url_for_children, celery_worker_command, wait_until
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
    "KILN_WORK_LEASE_SECONDS": "3", "KILN_WORK_QUEUE_GRACE_SECONDS": "20", **SHORT_MEASUREMENT_ENV,
}


class OwnRedis:
    """A redis-server of our own, without persistence: a restart forgets every queued message."""

    def __init__(self, log: Path, port: int = REDIS_PORT):
        self.log = log
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                             "--appendonly", "no", "--daemonize", "no"], stdout=out, stderr=subprocess.STDOUT)
        wait_until(self.ping, timeout=20, interval=0.1, message="our redis-server")

    def ping(self) -> bool:
        import redis

        try:
            return redis.Redis(port=self.port, socket_connect_timeout=1).ping()
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
def own_postgres():
    bin_dir = _postgres_bin()
    if bin_dir is None:
        pytest.skip("no PostgreSQL server binaries under /usr/lib/postgresql")
    # Not under pytest's root-only temporary folder: the `postgres` user must reach it.
    root = Path(tempfile.mkdtemp(prefix="kiln-pg-"))
    cluster = OwnPostgres(bin_dir, root)
    try:
        problem = cluster.init()
        if problem:
            pytest.skip(f"cannot run a throwaway PostgreSQL cluster here: {problem}")
        yield cluster
    finally:
        if (cluster.data / "postmaster.pid").exists():
            cluster._run(str(bin_dir / "pg_ctl"), "-D", str(cluster.data), "-w", "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)


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

        try:
            wait_until(healthy, timeout=60, message="the ASGI server")
        except AssertionError:
            stack.stop()
            raise
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
        # Measured once (the finalists' side-by-side re-timing is a task of its own, kiln.pipeline.retime).
        assert DeviceTask.objects.filter(job_id=job_id, variant=variant, purpose="measure").count() == 1
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


TENANT_CODE = """
from kiln.accounts.services import api_token_create, membership_ensure, organization_get_or_create
from kiln.fleet.services import registration_token_create
from django.contrib.auth import get_user_model
user, _ = get_user_model().objects.get_or_create(username="pia")
org = organization_get_or_create(name="Pias")
membership_ensure(user=user, organization=org, role="owner")
out = {"token": api_token_create(user=user, organization=org, name="t")[1],
       "registration": [registration_token_create(organization=org, user=user, name="t")[1] for _ in range(2)]}
"""

OUTCOME_CODE = """
from kiln.pipeline.models import Artifact, DeviceTask, Variant
job_id = {job_id}
out = {{"variants": sorted((v.precision, v.status, v.build_attempts) for v in Variant.objects.filter(job_id=job_id)),
        "artifacts": sorted(a.name for a in Artifact.objects.filter(job_id=job_id, kind="variant")),
        "tasks": sorted([t.variant.precision, t.leased_by.name, t.stage, t.status] for t in DeviceTask.objects.filter(job_id=job_id, purpose="measure"))}}
"""


def test_postgres_restarted_while_agents_long_poll_the_job_still_completes_and_nothing_is_stuck(own_postgres, own_redis, model_files, tmp_path):
    env = {**os.environ, "DATABASE_URL": own_postgres.url, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "platform")])}
    subprocess.run([sys.executable, "platform/manage.py", "migrate", "--verbosity", "0"], env=env, cwd=REPO, check=True, timeout=240)
    live = ServerStack.start(tmp_path, database_url=own_postgres.url, redis_url=own_redis.url)
    try:
        tenant = live.django(TENANT_CODE)
        api = Api(live.stack.url, tenant["token"])
        ids = upload_digits(api, model_files)
        secrets = iter(tenant["registration"])
        live.stack.registration_token = lambda _tenant: next(secrets)
        for name in ("one", "two"):
            live.stack.start_agent(None, name, backends="onnxruntime")
        job = api.post("/api/v1/jobs/", json={"model_version": ids["version"], "precisions": PRECISIONS})
        # Both agents are idle in a lease long-poll while the worker builds; the database restarts under them.
        def building() -> bool:
            state = api.get(f"/api/v1/jobs/{job['id']}/").json()
            return state["status"] == "running" and state["stage"] != "validate"

        wait_until(building, timeout=120, interval=0.2, message="the job to start building")
        own_postgres.pg_ctl("restart")
        server_log = tmp_path / "server.log"
        restarted_at = server_log.stat().st_size
        finished = api.wait_for_job(job["id"], live.stack, timeout=200)
        assert finished["status"] == "succeeded", (finished["events"], live.stack.logs())
        # Requests during the restart may fail (agents retry them); none once the database is back:
        # a pooled connection the restart killed is replaced, not handed to a request.
        after = server_log.read_bytes()[restarted_at:].decode(errors="replace")
        assert "Internal Server Error" not in after, after[-4000:]
        outcome = live.django(OUTCOME_CODE.format(job_id=job["id"]))
        assert outcome["variants"] == [[p, VariantStatus.READY, 1] for p in PRECISIONS], outcome
        assert len(outcome["artifacts"]) == len(PRECISIONS) == len({name.split(".")[0] for name in outcome["artifacts"]})
        # One task per variant and agent, each finished: none stuck queued or leased, none doubled.
        assert outcome["tasks"] == [[p, agent, "done", DeviceTaskStatus.SUCCEEDED] for p in PRECISIONS for agent in ("one", "two")], outcome
    finally:
        live.stack.stop()
