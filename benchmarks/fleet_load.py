"""Fleet load: simulated agents speaking the real protocol against a real server, ASGI against WSGI.

Each run starts the server the way `make up` does (gunicorn, 2 processes) in a scratch data folder:
`asgi` is kiln.asgi under uvicorn workers (what `make up` runs now), `wsgi` is kiln.wsgi with
2 x 8 threads (what it ran before). N simulated agents register, heartbeat every
`heartbeat_interval_s` (as the server says, with jitter) and long-poll for tasks with `wait_s` 20;
the benchmark queues short device tasks at a steady rate, the agent that leases one posts progress
and a result. A user lists jobs twice a second. Everything goes to loopback and stops by itself.

Printed per server: requests/s, p50/p99 per call, errors (timeouts, connection errors, 5xx,
unexpected 4xx), dispatch latency (task queued -> leased by an idle agent), the server's CPU
(seconds of CPU per second) and peak RSS (all its processes), the load client's own CPU and the
machine's load average (a shared machine: other work competes for the same cores), then the
ratios ASGI/WSGI.

    python benchmarks/fleet_load.py [--agents 200] [--seconds 60] [--servers asgi,wsgi]
        [--database-url postgres://...] [--redis-url redis://...]

Environment: KILN_FLEET_LOAD_PORT (default 18150; another checkout may be benchmarking on the same
machine), KILN_DB_POOL_SIZE (default 8, as `make up`) and any other KILN_* setting reach the server.

Without --database-url it uses the embedded default (SQLite + filesystem broker, as `make up`).
A PostgreSQL database given is flushed and migrated first: give it a scratch database.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import psutil

REPO = Path(__file__).resolve().parents[1]
# Another checkout on the same machine may run this benchmark at the same time: give it another port.
PORT = int(os.environ.get("KILN_FLEET_LOAD_PORT", "18150"))
REQUEST_TIMEOUT_S = 60.0
LEASE_WAIT_S = 20
TASK_RATE_PER_S = 2.0


# -- a minimal HTTP/1.1 client on asyncio (one keep-alive connection per simulated agent) -----

class HttpError(Exception):
    pass


class Connection:
    def __init__(self, port: int):
        self.port = port
        self.reader = self.writer = None

    async def request(self, method: str, path: str, body: dict | None = None, token: str | None = None) -> tuple[int, bytes]:
        payload = json.dumps(body).encode() if body is not None else b""
        head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(payload)}", "Content-Type: application/json"]
        if token:
            head.append(f"Authorization: Bearer {token}")
        message = ("\r\n".join(head) + "\r\n\r\n").encode() + payload
        for attempt in range(2):  # a keep-alive connection the server closed: reconnect once
            try:
                if self.writer is None:
                    self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
                self.writer.write(message)
                await self.writer.drain()
                return await self._response()
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                self.close()
                if attempt:
                    raise HttpError(f"connection: {exc}") from exc
        raise AssertionError("unreachable")

    async def _response(self) -> tuple[int, bytes]:
        status_line = await self.reader.readline()
        if not status_line:
            raise asyncio.IncompleteReadError(b"", None)
        status = int(status_line.split()[1])
        length, chunked, close = 0, False, False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding" and "chunked" in value:
                chunked = True
            elif name == "connection" and value == "close":
                close = True
        if chunked:
            body = b""
            while (size := int((await self.reader.readline()).strip() or b"0", 16)):
                body += await self.reader.readexactly(size + 2)
            await self.reader.readline()
        else:
            body = await self.reader.readexactly(length) if length else b""
        if close:
            self.close()
        return status, body

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


# -- measurements -----------------------------------------------------------------------------

@dataclass
class Stats:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    error_samples: list[str] = field(default_factory=list)
    dispatch: list[float] = field(default_factory=list)
    queued_at: dict[int, float] = field(default_factory=dict)
    # When each sample began (monotonic), and when the last agent finished registering: the p99s
    # "after enrolment" leave out the first seconds, when every agent registers at once.
    began: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    dispatch_began: list[float] = field(default_factory=list)
    enrolled_at: float = 0.0
    run_started: float = 0.0
    # The load client's own event loop: (when a tick was due, how late it ran), for ticks late by over 5 ms.
    loop_late: list[tuple[float, float]] = field(default_factory=list)
    loop_ticks: int = 0

    def after_enrolment(self, call: str) -> list[float]:
        values, began = (self.dispatch, self.dispatch_began) if call == "dispatch" else (self.latencies.get(call, []), self.began.get(call, []))
        return [value for value, start in zip(values, began, strict=True) if start >= self.enrolled_at]

    def error(self, call: str, what: str) -> None:
        self.errors[call] += 1
        if len(self.error_samples) < 8:
            self.error_samples.append(f"{call}: {what}")


async def timed(stats: Stats, call: str, connection: Connection, method: str, path: str, body=None, token=None, ok=(200, 201, 204)):
    started, began = time.perf_counter(), time.monotonic()
    try:
        status, payload = await asyncio.wait_for(connection.request(method, path, body, token), REQUEST_TIMEOUT_S + (LEASE_WAIT_S if call == "lease" else 0))
    except (TimeoutError, HttpError, OSError) as exc:
        connection.close()
        stats.error(call, type(exc).__name__)
        return None, None
    stats.latencies[call].append(time.perf_counter() - started)
    stats.began[call].append(began)
    if call == "register":
        stats.enrolled_at = max(stats.enrolled_at, time.monotonic())
    if status not in ok:
        stats.error(call, f"HTTP {status} {payload[:120]!r}")
        return status, None
    return status, payload


async def agent(index: int, registration: str, stats: Stats, stop: float) -> None:
    await asyncio.sleep(random.uniform(0, 5))  # agents come up over a few seconds, not in one burst
    connection, beats = Connection(PORT), Connection(PORT)
    capabilities = {"os": "linux", "cores": 2, "runtimes": {"onnxruntime": "1.20"}}
    status, payload = await timed(stats, "register", connection, "POST", "/api/agent/v1/register",
                                  {"registration_token": registration, "name": f"sim-{index}", "labels": {}, "capabilities": capabilities}, ok=(201,))
    if payload is None:
        return
    answer = json.loads(payload)
    token, interval = answer["agent_token"], float(answer.get("heartbeat_interval_s") or 10)

    async def heartbeat_loop():
        while time.monotonic() < stop:
            await asyncio.sleep(interval * random.uniform(0.8, 1.2))
            if time.monotonic() >= stop:
                return
            await timed(stats, "heartbeat", beats, "POST", "/api/agent/v1/heartbeat", {"capabilities": capabilities, "running_task": None}, token)

    heartbeats = asyncio.create_task(heartbeat_loop())
    while time.monotonic() < stop - 1:
        wait_s = min(LEASE_WAIT_S, max(0, int(stop - time.monotonic()) - 1))
        if wait_s <= 0:
            # A long-poll of 0 s answers at once: agents would poll in a tight loop in the last second.
            break
        status, payload = await timed(stats, "lease", connection, "POST", "/api/agent/v1/tasks/lease", {"wait_s": wait_s}, token)
        if status is None or (status not in (200, 204)):
            await asyncio.sleep(1)
            continue
        if status == 200:
            task = json.loads(payload)
            queued = stats.queued_at.pop(task["id"], None)
            if queued is not None:
                stats.dispatch.append(time.monotonic() - queued)
                stats.dispatch_began.append(queued)
            await timed(stats, "progress", connection, "POST", f"/api/agent/v1/tasks/{task['id']}/progress",
                        {"attempt": task["attempt"], "stage": "benchmark", "message": "simulated", "percent": 50}, token)
            await asyncio.sleep(0.2)
            await timed(stats, "result", connection, "POST", f"/api/agent/v1/tasks/{task['id']}/result",
                        {"attempt": task["attempt"], "status": "succeeded", "metrics": {"latency_ms": {"p50": 1.0}}}, token)
    heartbeats.cancel()
    connection.close()
    beats.close()


async def user(token: str, stats: Stats, stop: float) -> None:
    connection = Connection(PORT)
    while time.monotonic() < stop:
        await timed(stats, "user GET jobs", connection, "GET", "/api/v1/jobs/", token=token)
        await asyncio.sleep(0.5)


async def producer(fixture: dict, stats: Stats, stop: float) -> None:
    """Queue device tasks at a steady rate, as a dispatch would, and wake the waiting agents."""
    from asgiref.sync import sync_to_async

    count = 0
    while time.monotonic() < stop - 5:
        task_id = await sync_to_async(queue_task, thread_sensitive=True)(fixture, count)
        stats.queued_at[task_id] = time.monotonic()
        count += 1
        await asyncio.sleep(1 / TASK_RATE_PER_S)


# -- the server and its fixture ---------------------------------------------------------------

def queue_task(fixture: dict, index: int) -> int:
    from kiln.pipeline.models import DeviceTask
    from kiln.pipeline.queue import wake_agents

    task = DeviceTask.objects.create(organization_id=fixture["organization"], job_id=fixture["job"], variant_id=fixture["variant"],
                                     backend="onnxruntime", target=f"bench-{index}")
    wake_agents(organization_id=fixture["organization"], tasks=[task])  # as a dispatch does
    return task.id


def make_fixture() -> dict:
    """An organization with a user token, a registration token, and a job in its `devices` stage."""
    import onnx
    from django.contrib.auth import get_user_model
    from onnx import TensorProto, helper

    from kiln.accounts.services import api_token_create, membership_ensure, organization_get_or_create
    from kiln.fleet.services import registration_token_create
    from kiln.pipeline.models import Artifact, DeploymentJob, JobStatus, Variant, VariantStatus
    from kiln.registry.services import model_create

    user, _ = get_user_model().objects.get_or_create(username="bench")
    organization = organization_get_or_create(name="Bench")
    membership_ensure(user=user, organization=organization, role="owner")
    _, user_token = api_token_create(user=user, organization=organization, name="bench")
    _, registration = registration_token_create(organization=organization, user=user, name="bench")
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    path = Path(tempfile.mkdtemp()) / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    upload = SimpleNamespace(name="tiny.onnx", temporary_file_path=lambda: str(path), sha256=hashlib.sha256(path.read_bytes()).hexdigest())
    model = model_create(organization=organization, user=user, name="tiny", upload=upload)
    version = model.versions.first()
    job = DeploymentJob.objects.create(organization=organization, created_by=user, model_version=version, precisions=["fp32"],
                                       status=JobStatus.RUNNING, stage="devices", tolerance={"metric": "cosine", "max_drop": 0.01})
    artifact = Artifact.objects.create(organization=organization, job=job, kind="variant", name="fp32.onnx", blob=version.blob)
    variant = Variant.objects.create(organization=organization, job=job, key="fp32", precision="fp32", backends=["onnxruntime"],
                                     status=VariantStatus.READY, artifact=artifact)
    return {"organization": organization.id, "job": job.id, "variant": variant.id, "user_token": user_token, "registration": registration}


def server_command(kind: str) -> list[str]:
    from kiln.core.management.commands.up import web_server_command

    bin_dir = Path(sys.executable).parent
    if kind == "asgi":
        return web_server_command(bin_dir, bind=f"127.0.0.1:{PORT}", workers=2, platform_dir=REPO / "platform")
    return [str(bin_dir / "gunicorn"), "kiln.wsgi:application", "--bind", f"127.0.0.1:{PORT}", "--workers", "2", "--threads", "8",
            "--timeout", "300", "--chdir", str(REPO / "platform"), "--no-control-socket"]


class ServerSampler:
    """CPU seconds and peak RSS of the server's process tree, sampled once a second."""

    def __init__(self, pid: int):
        self.root = psutil.Process(pid)
        self.peak_rss = 0
        self.cpu = {}

    def tree(self):
        return [self.root, *self.root.children(recursive=True)]

    def sample(self) -> None:
        rss = 0
        for process in self.tree():
            try:
                times = process.cpu_times()
                self.cpu[process.pid] = times.user + times.system
                rss += process.memory_info().rss
            except psutil.Error:
                pass
        self.peak_rss = max(self.peak_rss, rss)

    async def run(self, stop: float) -> None:
        while time.monotonic() < stop:
            self.sample()
            await asyncio.sleep(1)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def loop_lag(stats: Stats, stop: float, tick_s: float = 0.02) -> None:
    """How late the load client's own event loop runs a 20 ms sleep: a request it times while late
    is late by the client, not by the server."""
    while time.monotonic() < stop:
        due = time.monotonic() + tick_s
        await asyncio.sleep(tick_s)
        stats.loop_ticks += 1
        late = time.monotonic() - due
        if late > 0.005:
            stats.loop_late.append((due, late))


async def drive(fixture: dict, agents: int, seconds: float, stats: Stats, sampler: ServerSampler) -> float:
    started = stats.run_started = time.monotonic()
    stop = started + seconds
    await asyncio.gather(
        *(agent(i, fixture["registration"], stats, stop) for i in range(agents)),
        user(fixture["user_token"], stats, stop), producer(fixture, stats, stop), sampler.run(stop), loop_lag(stats, stop),
    )
    return time.monotonic() - started


def run_one(kind: str, args, env: dict) -> dict:
    import django
    from django.core.management import call_command
    from django.db import connections

    data_dir = Path(env["KILN_DATA_DIR"])
    if data_dir.exists():
        shutil.rmtree(data_dir)
    data_dir.mkdir(parents=True)
    os.environ.update(env)
    django.setup()
    connections.close_all()
    if args.database_url:
        call_command("flush", interactive=False, verbosity=0)
    call_command("migrate", verbosity=0)
    fixture = make_fixture()
    connections.close_all()
    log = data_dir / f"server-{kind}.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(server_command(kind), env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                import urllib.request

                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/api/v1/health/", timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit(f"the {kind} server did not start; see {log.name}") from None
                time.sleep(0.5)
        sampler = ServerSampler(server.pid)
        sampler.sample()
        cpu_before = sum(sampler.cpu.values())
        stats = Stats()
        client_before = sum(psutil.Process().cpu_times()[:2])
        wall = asyncio.run(drive(fixture, args.agents, args.seconds, stats, sampler))
        client_cpu = sum(psutil.Process().cpu_times()[:2]) - client_before
        sampler.sample()
        cpu = sum(sampler.cpu.values()) - cpu_before
    finally:
        os.killpg(server.pid, 15)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
    return {"kind": kind, "stats": stats, "wall": wall, "cpu_per_s": cpu / wall, "peak_rss_mib": sampler.peak_rss / 2**20,
            "client_cpu_per_s": client_cpu / wall, "load": os.getloadavg()[0]}


def report(result: dict, agents: int) -> None:
    stats = result["stats"]
    total = sum(len(v) for v in stats.latencies.values())
    print(f"\n== {result['kind']}: {agents} agents, {result['wall']:.0f} s, {total / result['wall']:.0f} requests/s, "
          f"server CPU {result['cpu_per_s']:.2f} s/s, peak RSS {result['peak_rss_mib']:.0f} MiB")
    # The simulated fleet shares the machine with the server: its own CPU is capacity the server did not have.
    print(f"   load client CPU {result['client_cpu_per_s']:.2f} s/s (this process: agents, user, producer); "
          f"machine load average {result['load']:.1f} at the end")
    print(f"   after enrolment: samples begun once every agent had registered "
          f"({stats.enrolled_at - stats.run_started:.0f} s into the run)")
    print(f"{'call':<16}{'count':>8}{'p50 ms':>10}{'p99 ms':>10}{'errors':>8}{'after enrolment: count':>24}{'p99 ms':>10}")
    for call in ("register", "heartbeat", "lease", "progress", "result", "user GET jobs"):
        values, steady = stats.latencies.get(call, []), stats.after_enrolment(call)
        print(f"{call:<16}{len(values):>8}{percentile(values, 0.5) * 1000:>10.1f}{percentile(values, 0.99) * 1000:>10.1f}{stats.errors.get(call, 0):>8}"
              f"{len(steady):>24}{percentile(steady, 0.99) * 1000:>10.1f}")
    steady = stats.after_enrolment("dispatch")
    print(f"{'dispatch':<16}{len(stats.dispatch):>8}{percentile(stats.dispatch, 0.5) * 1000:>10.1f}{percentile(stats.dispatch, 0.99) * 1000:>10.1f}"
          f"{len(stats.queued_at):>8}{len(steady):>24}{percentile(steady, 0.99) * 1000:>10.1f}  (task queued -> leased; errors = still queued at the end)")
    print_client_loop_lag(stats)
    for sample in stats.error_samples:
        print("  error:", sample)


def client_lateness(stats: Stats, began: float, duration: float) -> float:
    """The most the load client's event loop was late while it timed one request (seconds)."""
    return max((late for due, late in stats.loop_late if began <= due + late and due <= began + duration), default=0.0)


def print_client_loop_lag(stats: Stats, slowest: int = 3) -> None:
    """The client's own event-loop lateness: a request timed while the client's loop was late is
    late by the client (it shares the machine's cores with the server), not by the server."""
    lateness = [late for _, late in stats.loop_late]
    print(f"   load client's event loop: {len(lateness)} of {stats.loop_ticks} 20 ms ticks late by over 5 ms, "
          f"the latest by {max(lateness, default=0.0) * 1000:.0f} ms")
    values, began = stats.latencies.get("user GET jobs", []), stats.began.get("user GET jobs", [])
    worst = sorted(zip(values, began, strict=True), reverse=True)[:slowest]
    if worst:
        print("   slowest user requests (ms), and the client's loop lateness during each: "
              + ", ".join(f"{duration * 1000:.0f} ({client_lateness(stats, start, duration) * 1000:.0f})" for duration, start in worst))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--servers", default="asgi,wsgi")
    parser.add_argument("--database-url", default="")
    parser.add_argument("--redis-url", default="")
    args = parser.parse_args()
    sys.path[:0] = [str(REPO), str(REPO / "platform")]
    scratch = Path(tempfile.mkdtemp(prefix="kiln-fleet-load-"))
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "kiln.settings", "KILN_DATA_DIR": str(scratch / "data"),
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "platform")]), "KILN_CREDENTIALS_RATE": "100000/min",
           "KILN_LOG_LEVEL": "WARNING"}
    # As `make up` serves (its pool size unless KILN_DB_POOL_SIZE is set).
    env.setdefault("KILN_DB_POOL_SIZE", "8")
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    if args.database_url:
        env["DATABASE_URL"] = args.database_url
    if args.redis_url:
        env["REDIS_URL"] = args.redis_url
    print(f"fleet_load: {args.agents} agents x {args.seconds:.0f} s, database {'PostgreSQL' if args.database_url else 'SQLite'}, "
          f"broker {'Redis' if args.redis_url else 'filesystem'}; {psutil.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    results = []
    for kind in args.servers.split(","):
        # Each server kind in a fresh process: Django is set up once per process.
        child = subprocess.run([sys.executable, __file__, "--one", kind, "--agents", str(args.agents), "--seconds", str(args.seconds),
                                "--database-url", args.database_url, "--redis-url", args.redis_url], env=env, capture_output=True, text=True, check=False)
        sys.stdout.write(child.stdout)
        if child.returncode != 0:
            sys.stderr.write(child.stderr[-3000:])
        results += [json.loads(line.split(" ", 1)[1]) for line in child.stdout.splitlines() if line.startswith("summary ")]
    shutil.rmtree(scratch, ignore_errors=True)
    by_kind = {result["kind"]: result for result in results}
    if {"asgi", "wsgi"} <= set(by_kind):
        asgi, wsgi = by_kind["asgi"], by_kind["wsgi"]
        print(f"\nratios WSGI/ASGI (> 1: ASGI better): user p99 {wsgi['user_p99_ms'] / asgi['user_p99_ms']:.1f}x, "
              f"heartbeat p99 {wsgi['heartbeat_p99_ms'] / asgi['heartbeat_p99_ms']:.1f}x, errors {wsgi['errors']} vs {asgi['errors']}")


def main_one() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--one")
    parser.add_argument("--agents", type=int)
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--database-url", default="")
    parser.add_argument("--redis-url", default="")
    args = parser.parse_args()
    sys.path[:0] = [str(REPO), str(REPO / "platform")]
    result = run_one(args.one, args, dict(os.environ))
    report(result, args.agents)
    summary = {"kind": args.one, "user_p99_ms": percentile(result["stats"].latencies.get("user GET jobs", []), 0.99) * 1000,
               "heartbeat_p99_ms": percentile(result["stats"].latencies.get("heartbeat", []), 0.99) * 1000,
               "errors": sum(result["stats"].errors.values()), "dispatch_p99_ms": percentile(result["stats"].dispatch, 0.99) * 1000,
               **{f"{name}_p99_after_enrolment_ms": percentile(result["stats"].after_enrolment(call), 0.99) * 1000
                  for name, call in (("user", "user GET jobs"), ("heartbeat", "heartbeat"), ("dispatch", "dispatch"))}}
    print("summary", json.dumps(summary))


if __name__ == "__main__":
    if "--one" in sys.argv:
        main_one()
    else:
        main()
