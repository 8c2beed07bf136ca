"""Shared fixtures: tenants with API clients, small real models, and a live stack of real processes."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Tenant:
    user: object
    organization: object
    token: str
    client: object


def make_tenant(*, username: str, organization: str, role: str = "owner", password: str | None = None) -> Tenant:
    from django.contrib.auth import get_user_model
    from rest_framework.test import APIClient

    from kiln.accounts.services import api_token_create, membership_ensure, organization_get_or_create

    user, _ = get_user_model().objects.get_or_create(username=username)
    if password:
        user.set_password(password)
        user.save()
    org = organization_get_or_create(name=organization)
    membership_ensure(user=user, organization=org, role=role)
    _, secret = api_token_create(user=user, organization=org, name="tests")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return Tenant(user=user, organization=org, token=secret, client=client)


@pytest.fixture(scope="session", autouse=True)
def registered_tasks():
    """The pipeline sends tasks by name; a name resolves to an in-process (eager) run only once
    the task module is imported, which a worker does at start and a test process must do here."""
    import workers.tasks  # noqa: F401


@pytest.fixture(autouse=True)
def fresh_throttles():
    """Throttle counters live in the (per-process) cache: each test starts with none."""
    from django.core.cache import cache

    from kiln.accounts import token_cache as api_token_cache
    from kiln.fleet import heartbeats, intervals, lease_precheck, token_cache

    cache.clear()
    token_cache.clear()
    api_token_cache.clear()
    lease_precheck.clear()
    heartbeats.clear()
    intervals.clear()
    yield


@pytest.fixture
def tenant(db) -> Tenant:
    return make_tenant(username="alice", organization="Acme")


@pytest.fixture
def other_tenant(db) -> Tenant:
    return make_tenant(username="mallory", organization="Rival")


@pytest.fixture(scope="session")
def digits():
    from tests.fixtures.models import train_digits_cnn

    return train_digits_cnn()


@pytest.fixture(scope="session")
def model_files(tmp_path_factory, digits):
    """The digits CNN as an .onnx file plus calibration and validation .npz files."""
    import onnx

    from tests.fixtures.models import write_npz

    root = tmp_path_factory.mktemp("digits")
    model = root / "digits.onnx"
    onnx.save(digits.model, model)
    calibration = write_npz(root / "calibration.npz", input=digits.x_calib)
    validation = write_npz(root / "validation.npz", input=digits.x_val, labels=digits.y_val)
    return {"model": model, "calibration": calibration, "validation": validation, "root": root}


def upload(client, url: str, path: Path, **fields):
    with open(path, "rb") as handle:
        return client.post(url, {**fields, "file": handle}, format="multipart")


# -- live stack: the real server, a real Celery worker process, real agent processes ---------

def _database_url_for_children() -> str:
    from django.db import connection

    settings_dict = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{settings_dict['NAME']}"
    user = settings_dict.get("USER") or ""
    password = f":{settings_dict['PASSWORD']}" if settings_dict.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = settings_dict.get("PORT") or 5432
    return f"postgres://{auth}{host}:{port}/{settings_dict['NAME']}"


DEFAULT_AGENT_BACKENDS = "onnxruntime,openvino"


@dataclass
class LiveStack:
    url: str
    env: dict
    log_dir: Path
    processes: list = field(default_factory=list)

    def spawn(self, name: str, args: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "ab")
        process = subprocess.Popen(args, env={**self.env, **(env or {})}, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        process.log_path = self.log_dir / f"{name}.log"
        self.processes.append(process)
        return process

    def pin(self, process: subprocess.Popen, cpus: list[int]) -> None:
        """Confine a spawned process and its children, every thread of each, to `cpus` (children and threads started later
        inherit the mask). Setting a process's affinity sets its main thread's only: threads already running (an agent's
        heartbeat, ONNX Runtime's pool) kept every CPU, and an agent's window subtracted their CPU time from its own core's."""
        root = psutil.Process(process.pid)
        for member in [root, *root.children(recursive=True)]:
            for thread in member.threads():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.sched_setaffinity(thread.id, cpus)
            member.cpu_affinity(cpus)

    def agent_on_its_own_core(self, agent: subprocess.Popen) -> bool:
        """The agent on the last CPU, the worker on the others: a device apart from the worker, as on separate hardware,
        so that its timings are not taken while the worker calibrates or trains. False (nothing pinned) on one CPU."""
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            return False
        self.pin(agent, cpus[-1:])
        for process in self.processes:
            if process is not agent and process.log_path.name == "worker.log":
                self.pin(process, cpus[:-1])
        return True

    def create_user(self, username: str, password: str, organization: str) -> Tenant:
        return make_tenant(username=username, organization=organization, password=password)

    def registration_token(self, tenant: Tenant) -> str:
        from kiln.fleet.services import registration_token_create

        _, secret = registration_token_create(organization=tenant.organization, user=tenant.user, name="tests")
        return secret

    def start_agent(self, tenant: Tenant, name: str, *, labels: dict | None = None, backends: str | None = None) -> subprocess.Popen:
        config = self.log_dir / f"agent-{name}.json"
        # The ONNX runtimes unless a test asks for others: LiteRT builds (tests/e2e/test_litert_stack.py) take a minute each.
        agent_env = {"KILN_AGENT_CONFIG": str(config), "KILN_AGENT_BACKENDS": backends or DEFAULT_AGENT_BACKENDS}
        register = [sys.executable, "-m", "devices.agent", "register", "--server", self.url, "--registration-token",
                    self.registration_token(tenant), "--name", name]
        for key, value in (labels or {}).items():
            register += ["--label", f"{key}={value}"]
        subprocess.run(register, env={**self.env, **agent_env}, cwd=REPO, check=True, capture_output=True, timeout=60)
        return self.spawn(f"agent-{name}", [sys.executable, "-m", "devices.agent", "run", "--work-dir", str(self.log_dir / f"work-{name}")], agent_env)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def logs(self) -> str:
        return "\n".join(f"--- {p.log_path.name}\n{p.log_path.read_text(errors='replace')[-4000:]}" for p in self.processes)


def wait_until(predicate, *, timeout: float, interval: float = 0.5, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {message}")


def celery_worker_command(schedule: Path) -> list[str]:
    """A real Celery worker process that serves every work class (workers/routing.py) and runs the housekeeping beat."""
    from workers.routing import all_queues

    return [sys.executable, "-m", "celery", "-A", "workers.celery", "worker", "--loglevel", "INFO", "--queues", ",".join(all_queues()),
            "--concurrency", "1", "--pool", "solo", "--without-heartbeat", "--without-gossip", "--without-mingle",
            "--beat", "--schedule", str(schedule)]


# End-to-end stacks that are not about measurement keep its care short: on a CI machine that the other shards load,
# most timing windows are busy, and re-taking each (KILN_AGENT_RETAKES) through 30 interleaved rounds of re-timing made
# one job outlast its test; a decision on busy rounds is provisional and stays so (no re-timing that waits for a quiet
# device, KILN_RETIME_QUIET_ATTEMPTS). tests/e2e/test_measurement_stack.py turns re-takes and quiet re-timing back on;
# tests/devices/test_quiet.py, tests/devices/test_paired.py and tests/platform/reports test them in full.
SHORT_MEASUREMENT_ENV = {"KILN_AGENT_RETAKES": "0", "KILN_RETIME_MAX_ROUNDS": "6", "KILN_RETIME_QUIET_ATTEMPTS": "0"}


@pytest.fixture
def kiln_stack(transactional_db, live_server, tmp_path, settings):
    """A live server (this process), a real Celery worker process, and agents on demand."""
    from django.conf import settings as django_settings

    # Short intervals so that lease expiry and cancellation are observable within a test.
    settings.AGENT_LEASE_SECONDS = 8
    settings.AGENT_HEARTBEAT_SECONDS = 2
    settings.AGENT_LONG_POLL_SECONDS = 2
    settings.AGENT_OFFLINE_AFTER_SECONDS = 30
    settings.BENCHMARK_MIN_RUNS = 20
    settings.BENCHMARK_MIN_SECONDS = 0.3
    settings.BENCHMARK_WARMUP_RUNS = 3
    settings.BENCHMARK_WARMUP_SECONDS = 0.05
    settings.RETIME_MAX_ROUNDS = int(SHORT_MEASUREMENT_ENV["KILN_RETIME_MAX_ROUNDS"])
    settings.RETIME_QUIET_ATTEMPTS = int(SHORT_MEASUREMENT_ENV["KILN_RETIME_QUIET_ATTEMPTS"])
    env = {
        **os.environ,
        **SHORT_MEASUREMENT_ENV,
        "DATABASE_URL": _database_url_for_children(),
        "KILN_DATA_DIR": str(django_settings.DATA_DIR),
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "platform")]),
        "PYTHONUNBUFFERED": "1",
    }
    stack = LiveStack(url=live_server.url, env=env, log_dir=tmp_path)
    from workers.celery import app as celery_app

    # Messages left in the broker by an earlier run name rows of an earlier database.
    celery_app.control.purge()
    stack.spawn("worker", celery_worker_command(tmp_path / "celerybeat-schedule"), {"KILN_HOUSEKEEPING_SECONDS": "1"})
    try:
        yield stack
        every_finished_job_agrees_with_its_report()
    finally:
        stack.stop()


def every_finished_job_agrees_with_its_report() -> None:
    """The agreement test over every job a live stack finished (tests/agreement.py): each row's figures come from one
    measurement set, each device's decision says what its table shows (its headline ratio inside the interval printed
    beside it, provisional exactly when its windows were busy), and every ratio in the search notes can be recomputed from
    the table. Runs when a test that used the stack ends, so every e2e job is checked."""
    from kiln.pipeline.models import DeploymentJob, JobStatus
    from kiln.reports.selectors import job_report
    from tests.agreement import assert_report_agrees

    for job in DeploymentJob.objects.filter(status=JobStatus.SUCCEEDED).select_related("model_version"):
        assert_report_agrees(job_report(job=job))


# -- object storage: a real S3-compatible server (moto's server mode) in its own process -----

@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    from tests.fixtures.s3 import start_s3_server, stop_s3_server

    server = start_s3_server(tmp_path_factory.mktemp("s3"))
    try:
        yield server
    finally:
        stop_s3_server(server)


@pytest.fixture
def s3_storage(s3_server, settings, tmp_path):
    """This process stores blobs in the S3 server (an emptied bucket); BLOB_ROOT holds only local copies."""
    from tests.fixtures.s3 import BUCKET, use_s3

    client = s3_server.client()
    for key in s3_server.object_keys():
        client.delete_object(Bucket=BUCKET, Key=key)
    settings.BLOB_ROOT = tmp_path / "blobs"
    use_s3(settings, s3_server)
    return s3_server


# The session's exit status, for pytest_unconfigure below.
_SESSION = {}


def pytest_sessionfinish(session, exitstatus):
    _SESSION["exitstatus"] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Exit with the session's status once every report is written, even if a thread would keep the process alive.

    A CI shard once printed "32 passed" and then never exited: the interpreter's shutdown waited on a non-daemon thread
    (an event loop one of the in-process servers had started) that nothing would stop, and the suite would have hung
    until CI's limit. The threads left behind are named here, so that the one that leaked can be found and stopped."""
    stuck = [thread for thread in threading.enumerate() if thread is not threading.main_thread() and thread.is_alive() and not thread.daemon]
    if stuck and "exitstatus" in _SESSION:
        sys.stdout.flush()
        sys.stderr.write(f"pytest: {len(stuck)} non-daemon thread(s) still running at exit, not waited for: "
                         f"{', '.join(thread.name for thread in stuck)}\n")
        sys.stderr.flush()
        os._exit(_SESSION["exitstatus"])
