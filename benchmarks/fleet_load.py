"""Fleet load: simulated agents on the real protocol against a real server, and what each agent costs it.

Each run starts the server the way `make up` does (gunicorn, 2 uvicorn workers: `asgi`; or the WSGI
server it ran before issue 10: `wsgi`) in a scratch data folder. N simulated agents, in processes of
their own (`--agent-processes`, so that the load generator's CPU is counted apart from the server's),
register and ask for work as the real agent does (`--protocol longpoll`: the lease long-poll is the
heartbeat, its wait the server's `long_poll_s` less up to 10 % jitter, no other request while idle)
or as agents did before (`--protocol heartbeats`: a heartbeat every `heartbeat_interval_s` beside a
20 s long-poll). The benchmark queues short device tasks at a steady rate (`--task-rate`); the agent
that leases one posts progress and a result. A user lists jobs twice a second (`--user-rate`).
Everything goes to loopback and stops by itself. With `--task-rate 0 --user-rate 0` the server
serves nothing but idle agents: the cost of one idle agent, alone.

Printed per server: requests/s; p50/p99 per call, and over the samples begun once every agent had
registered; a long-poll's answer (how late a 204 came after the wait it asked for); dispatch latency
(task queued -> leased by a waiting agent); errors (timeouts, connection errors, 5xx, unexpected
4xx); the server's CPU per second and per agent-minute, its database queries per agent-minute (the
`kiln_db_queries_total` of its /metrics; the benchmark turns KILN_METRICS on) and requests per
agent-minute, over the whole run and after enrolment; the agents one fully used core would serve at
that cost; peak RSS; the load generator's own CPU (agent processes and this one) and the machine's
load average (a shared machine: other work competes for the same cores).

    python benchmarks/fleet_load.py [--agents 1000] [--seconds 300] [--agent-processes 2]
        [--protocol longpoll|heartbeats] [--task-rate 2] [--user-rate 2] [--servers asgi]
        [--database-url postgres://...] [--redis-url redis://...] [--server-checkout PATH]

Environment: KILN_FLEET_LOAD_PORT (default 18150; another checkout may be benchmarking on the same
machine), KILN_DB_POOL_SIZE (default 8, as `make up`) and any other KILN_* setting reach the server.
`--server-checkout` serves from another checkout of Kiln (the code before a change) with the same
load generator; a server without `kiln_db_queries_total` reports its queries as n/a.

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
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import psutil

REPO = Path(__file__).resolve().parents[1]
# Another checkout on the same machine may run this benchmark at the same time: give it another port.
PORT = int(os.environ.get("KILN_FLEET_LOAD_PORT", "18150"))
REQUEST_TIMEOUT_S = 60.0
HEARTBEATS_PROTOCOL_WAIT_S = 20
REGISTRATION_ENV = "KILN_FLEET_LOAD_REGISTRATION"
CALLS = ("register", "heartbeat", "lease", "progress", "result", "user GET jobs")


# -- a minimal HTTP/1.1 client on asyncio (one keep-alive connection per simulated agent) -----

class HttpError(Exception):
    pass


class Connection:
    def __init__(self, port: int):
        self.port = port
        self.reader = self.writer = None

    async def request(self, method: str, path: str, body: dict | None = None, token: str | None = None) -> tuple[int, dict, bytes]:
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

    async def _response(self) -> tuple[int, dict, bytes]:
        status_line = await self.reader.readline()
        if not status_line:
            raise asyncio.IncompleteReadError(b"", None)
        status = int(status_line.split()[1])
        headers, length, chunked, close = {}, 0, False, False
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            name, value = name.strip().lower(), value.strip()
            headers[name] = value
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
            elif name == "connection" and value.lower() == "close":
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
        return status, headers, body

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


# -- measurements (wall-clock times: samples come from several processes) ----------------------

@dataclass
class Stats:
    # call -> [(began, seconds)]; a lease's entry also holds the wait it asked for and its status.
    samples: dict[str, list] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    error_samples: list[str] = field(default_factory=list)
    leased_at: dict[str, float] = field(default_factory=dict)  # task id -> when an agent got it
    enrolled_at: float = 0.0  # when the last agent finished registering
    # The process's own event loop: ticks late by over 5 ms as (when due, how late), and all ticks.
    loop_late: list = field(default_factory=list)
    loop_ticks: int = 0
    cpu_s: float = 0.0

    def error(self, call: str, what: str) -> None:
        self.errors[call] += 1
        if len(self.error_samples) < 8:
            self.error_samples.append(f"{call}: {what}")

    def to_json(self) -> dict:
        return {"samples": self.samples, "errors": self.errors, "error_samples": self.error_samples, "leased_at": self.leased_at,
                "enrolled_at": self.enrolled_at, "loop_late": self.loop_late, "loop_ticks": self.loop_ticks, "cpu_s": self.cpu_s}

    def merge(self, other: dict) -> None:
        for call, values in other["samples"].items():
            self.samples[call] += values
        for call, count in other["errors"].items():
            self.errors[call] += count
        self.error_samples += other["error_samples"][: max(0, 8 - len(self.error_samples))]
        self.leased_at.update(other["leased_at"])
        self.enrolled_at = max(self.enrolled_at, other["enrolled_at"])


async def timed(stats: Stats, call: str, connection: Connection, method: str, path: str, body=None, token=None,
                ok=(200, 201, 204), extra_wait_s: float = 0.0):
    """One request: (status, headers, body), or (None, None, None) on a failure (counted)."""
    started, began = time.perf_counter(), time.time()
    try:
        status, headers, payload = await asyncio.wait_for(connection.request(method, path, body, token), REQUEST_TIMEOUT_S + extra_wait_s)
    except (TimeoutError, HttpError, OSError) as exc:
        connection.close()
        stats.error(call, type(exc).__name__)
        return None, None, None
    elapsed = time.perf_counter() - started
    if call == "lease":
        stats.samples[call].append((began, elapsed, body["wait_s"], status))
    else:
        stats.samples[call].append((began, elapsed))
    if call == "register":
        stats.enrolled_at = max(stats.enrolled_at, time.time())
    if status not in ok:
        stats.error(call, f"HTTP {status} {payload[:120]!r}")
        return status, headers, None
    return status, headers, payload


async def loop_lag(stats: Stats, stop: float, tick_s: float = 0.02) -> None:
    """How late this process's event loop runs a 20 ms sleep: a request it times while late is late
    by the load generator, not by the server."""
    while time.time() < stop:
        due = time.time() + tick_s
        await asyncio.sleep(tick_s)
        stats.loop_ticks += 1
        late = time.time() - due
        if late > 0.005:
            stats.loop_late.append((due, late))


# -- the simulated agents (in processes of their own) -------------------------------------------

async def agent(index: int, registration: str, stats: Stats, stop: float, protocol: str) -> None:
    await asyncio.sleep(random.uniform(0, 5))  # agents come up over a few seconds, not in one burst
    connection, beats = Connection(PORT), Connection(PORT)
    capabilities = {"os": "linux", "cores": 2, "runtimes": {"onnxruntime": "1.20"}}
    _, _, payload = await timed(stats, "register", connection, "POST", "/api/agent/v1/register",
                                {"registration_token": registration, "name": f"sim-{index}", "labels": {}, "capabilities": capabilities}, ok=(201,))
    if payload is None:
        return
    answer = json.loads(payload)
    token = answer["agent_token"]
    intervals = {"heartbeat": float(answer.get("heartbeat_interval_s") or 10), "long_poll": float(answer.get("long_poll_s") or 20)}

    async def heartbeat_loop():
        # The protocol before: a heartbeat every interval, whether or not a long-poll is open.
        while time.time() < stop:
            await asyncio.sleep(intervals["heartbeat"] * random.uniform(0.8, 1.2))
            if time.time() >= stop:
                return
            await timed(stats, "heartbeat", beats, "POST", "/api/agent/v1/heartbeat", {"capabilities": capabilities, "running_task": None}, token)

    heartbeats = asyncio.create_task(heartbeat_loop()) if protocol == "heartbeats" else None
    while time.time() < stop - 1:
        wanted = HEARTBEATS_PROTOCOL_WAIT_S if protocol == "heartbeats" else intervals["long_poll"] * random.uniform(0.9, 1.0)
        wait_s = round(min(wanted, stop - time.time() - 1), 2)
        if wait_s < 1:
            # A long-poll of 0 s answers at once: agents would poll in a tight loop in the last second.
            break
        status, headers, payload = await timed(stats, "lease", connection, "POST", "/api/agent/v1/tasks/lease", {"wait_s": wait_s}, token,
                                               extra_wait_s=wait_s)
        if status not in (200, 204):
            await asyncio.sleep(1)
            continue
        if headers.get("kiln-long-poll"):
            intervals["long_poll"] = float(headers["kiln-long-poll"])
        if status == 200:
            task = json.loads(payload)
            stats.leased_at[str(task["id"])] = time.time()
            await timed(stats, "progress", connection, "POST", f"/api/agent/v1/tasks/{task['id']}/progress",
                        {"attempt": task["attempt"], "stage": "benchmark", "message": "simulated", "percent": 50}, token)
            await asyncio.sleep(0.2)
            await timed(stats, "result", connection, "POST", f"/api/agent/v1/tasks/{task['id']}/result",
                        {"attempt": task["attempt"], "status": "succeeded", "metrics": {"latency_ms": {"p50": 1.0}}}, token)
    if heartbeats is not None:
        heartbeats.cancel()
    connection.close()
    beats.close()


async def agents_drive(first: int, count: int, registration: str, stop: float, protocol: str, stats: Stats) -> None:
    await asyncio.gather(*(agent(first + i, registration, stats, stop, protocol) for i in range(count)), loop_lag(stats, stop))


def agents_process_main(args) -> None:
    """One load-generator process: `--count` agents from `--first`, until `--stop-at`; the stats go to `--out`."""
    stats = Stats()
    delay = args.start_at - time.time()
    if delay > 0:
        time.sleep(delay)
    asyncio.run(agents_drive(args.first, args.count, os.environ[REGISTRATION_ENV], args.stop_at, args.protocol, stats))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    stats.cpu_s = usage.ru_utime + usage.ru_stime
    Path(args.out).write_text(json.dumps(stats.to_json()))


# -- the coordinator: server, user, producer, samplers -------------------------------------------

async def user(token: str, stats: Stats, stop: float, rate: float) -> None:
    connection = Connection(PORT)
    while rate > 0 and time.time() < stop:
        await timed(stats, "user GET jobs", connection, "GET", "/api/v1/jobs/", token=token)
        await asyncio.sleep(1 / rate)


async def producer(fixture: dict, queued_at: dict, stop: float, rate: float) -> None:
    """Queue device tasks at a steady rate, as a dispatch would, and wake the waiting agents."""
    from asgiref.sync import sync_to_async

    if rate <= 0:
        return
    count = 0
    while time.time() < stop - 5:
        task_id = await sync_to_async(queue_task, thread_sensitive=True)(fixture, count)
        queued_at[str(task_id)] = time.time()
        count += 1
        await asyncio.sleep(1 / rate)


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


def server_command(kind: str, checkout: Path) -> list[str]:
    from kiln.core.management.commands.up import web_server_command

    bin_dir = Path(sys.executable).parent
    if kind == "asgi":
        return web_server_command(bin_dir, bind=f"127.0.0.1:{PORT}", workers=2, platform_dir=checkout / "platform")
    return [str(bin_dir / "gunicorn"), "kiln.wsgi:application", "--bind", f"127.0.0.1:{PORT}", "--workers", "2", "--threads", "8",
            "--timeout", "300", "--chdir", str(checkout / "platform"), "--no-control-socket"]


class ServerSampler:
    """The server's process tree, sampled once a second (CPU seconds, peak RSS), and its /metrics (queries)."""

    def __init__(self, pid: int):
        self.root = psutil.Process(pid)
        self.peak_rss = 0
        self.cpu: dict[int, float] = {}
        self.cpu_series: list[tuple[float, float]] = []  # (when, CPU seconds of the tree so far)
        self.query_series: list[tuple[float, float]] = []  # (when, kiln_db_queries_total)

    def sample(self) -> None:
        rss = 0
        for process in [self.root, *self.root.children(recursive=True)]:
            try:
                times = process.cpu_times()
                self.cpu[process.pid] = times.user + times.system
                rss += process.memory_info().rss
            except psutil.Error:
                pass
        self.peak_rss = max(self.peak_rss, rss)
        self.cpu_series.append((time.time(), sum(self.cpu.values())))

    def scrape(self) -> None:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=10).read().decode()
        except OSError:
            return
        for line in text.splitlines():
            if line.startswith("kiln_db_queries_total "):
                self.query_series.append((time.time(), float(line.split()[-1])))

    async def run(self, stop: float, scrape_every_s: int) -> None:
        from asgiref.sync import sync_to_async

        ticks = 0
        while time.time() < stop:
            self.sample()
            if ticks % scrape_every_s == 0:
                await sync_to_async(self.scrape, thread_sensitive=False)()
            ticks += 1
            await asyncio.sleep(1)


def window(series: list[tuple[float, float]], since: float) -> tuple[float, float] | None:
    """(seconds, increase) of a cumulative series from its first sample at or after `since` to its last."""
    later = [point for point in series if point[0] >= since]
    if len(later) < 2:
        return None
    return later[-1][0] - later[0][0], later[-1][1] - later[0][1]


async def drive(fixture: dict, args, stats: Stats, sampler: ServerSampler, queued_at: dict, stop: float) -> None:
    await asyncio.gather(user(fixture["user_token"], stats, stop, args.user_rate), producer(fixture, queued_at, stop, args.task_rate),
                         # A scrape costs the server a few queries and milliseconds: about 20 a run.
                         sampler.run(stop, scrape_every_s=max(5, int(args.seconds / 20))), loop_lag(stats, stop))


def spawn_agent_processes(args, registration: str, scratch: Path, start_at: float, stop_at: float) -> list[tuple[subprocess.Popen, Path]]:
    processes = []
    per_process = -(-args.agents // args.agent_processes)
    for index in range(args.agent_processes):
        first, count = index * per_process, min(per_process, args.agents - index * per_process)
        if count <= 0:
            break
        out = scratch / f"agents-{index}.json"
        command = [sys.executable, __file__, "--agents-process", "--first", str(first), "--count", str(count), "--protocol", args.protocol,
                   "--start-at", str(start_at), "--stop-at", str(stop_at), "--out", str(out)]
        processes.append((subprocess.Popen(command, env={**os.environ, REGISTRATION_ENV: registration}), out))
    return processes


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
    checkout = Path(args.server_checkout or REPO).resolve()
    # Only the server counts its queries on /metrics (this process's own go to no exposition).
    server_env = {**env, "KILN_METRICS": "true", "PROMETHEUS_MULTIPROC_DIR": str(data_dir / "metrics"),
                  "PYTHONPATH": os.pathsep.join([str(checkout), str(checkout / "platform")])}
    (data_dir / "metrics").mkdir()
    log = data_dir / f"server-{kind}.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(server_command(kind, checkout), env=server_env, cwd=checkout, stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    agents = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/api/v1/health/", timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit(f"the {kind} server did not start; see {log.name}") from None
                time.sleep(0.5)
        load_start = os.getloadavg()[0]
        sampler = ServerSampler(server.pid)
        sampler.sample()
        sampler.scrape()
        # The agent processes import little; they start together once every one is up.
        started = time.time() + 3
        stop = started + args.seconds
        agents = spawn_agent_processes(args, fixture["registration"], data_dir, started, stop)
        stats, queued_at = Stats(), {}
        coordinator_before = sum(psutil.Process().cpu_times()[:2])
        time.sleep(max(0.0, started - time.time()))
        asyncio.run(drive(fixture, args, stats, sampler, queued_at, stop))
        coordinator_cpu = sum(psutil.Process().cpu_times()[:2]) - coordinator_before
        agents_cpu = 0.0
        for process, out in agents:
            process.wait(timeout=REQUEST_TIMEOUT_S + 60)
            part = json.loads(out.read_text())
            agents_cpu += part["cpu_s"]
            stats.merge(part)
            stats.loop_late += [("agents", late) for _, late in part["loop_late"]]
        wall = time.time() - started
        sampler.sample()
        sampler.scrape()
    finally:
        for process, _ in agents:
            if process.poll() is None:
                process.kill()
        os.killpg(server.pid, 15)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
    return {"kind": kind, "stats": stats, "wall": wall, "started": started, "sampler": sampler, "queued_at": queued_at,
            "coordinator_cpu": coordinator_cpu, "agents_cpu": agents_cpu, "load": (load_start, os.getloadavg()[0])}


# -- the report --------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def durations(stats: Stats, call: str, since: float = 0.0) -> list[float]:
    return [sample[1] for sample in stats.samples.get(call, []) if sample[0] >= since]


def long_poll_answers(stats: Stats, since: float = 0.0) -> list[float]:
    """How late each long-poll that found nothing was answered, after the wait it asked for (seconds)."""
    return [max(0.0, elapsed - wait_s) for began, elapsed, wait_s, status in stats.samples.get("lease", []) if status == 204 and began >= since]


def dispatches(result: dict, since: float = 0.0) -> tuple[list[float], int]:
    """(queued -> leased seconds of the tasks queued after `since`, how many were never leased)."""
    stats, queued_at = result["stats"], result["queued_at"]
    latencies = [stats.leased_at[task] - queued for task, queued in queued_at.items() if task in stats.leased_at and queued >= since]
    return latencies, sum(1 for task in queued_at if task not in stats.leased_at)


def cost(result: dict, agents: int, since: float) -> dict:
    """Server CPU, database queries and requests per agent-minute over the samples from `since` on."""
    stats, sampler = result["stats"], result["sampler"]
    found = {}
    cpu = window(sampler.cpu_series, since)
    if cpu:
        found["seconds"], found["cpu_s"] = cpu
    queries = window(sampler.query_series, since)
    if queries:
        found["queries"], found["queries_seconds"] = queries[1], queries[0]
    span = found.get("seconds") or result["wall"]
    requests = sum(1 for values in stats.samples.values() for sample in values if sample[0] >= since)
    found["requests"], found["agent_minutes"] = requests, agents * span / 60
    return found


def print_cost(label: str, found: dict, agents: int) -> dict:
    minutes = found["agent_minutes"]
    cpu_ms = found["cpu_s"] * 1000 / minutes if "cpu_s" in found else float("nan")
    queries = found["queries"] / (agents * found["queries_seconds"] / 60) if found.get("queries_seconds") else float("nan")
    requests = found["requests"] / minutes
    per_core = 60_000 / cpu_ms if cpu_ms == cpu_ms and cpu_ms > 0 else float("nan")
    print(f"   {label}: server CPU {cpu_ms:.2f} ms, {queries:.2f} database queries, {requests:.2f} requests per agent-minute"
          f" -> about {per_core:,.0f} agents per fully used core at this cost")
    return {"cpu_ms_per_agent_minute": cpu_ms, "queries_per_agent_minute": queries, "requests_per_agent_minute": requests}


def report(result: dict, args) -> dict:
    stats, agents = result["stats"], args.agents
    total = sum(len(v) for v in stats.samples.values())
    enrolled = stats.enrolled_at or result["started"]
    cpu = window(result["sampler"].cpu_series, 0.0)
    print(f"\n== {result['kind']} ({args.protocol}): {agents} agents in {args.agent_processes} process(es), {result['wall']:.0f} s, "
          f"{total / result['wall']:.0f} requests/s, server CPU {cpu[1] / cpu[0]:.2f} s/s, peak RSS {result['sampler'].peak_rss / 2**20:.0f} MiB")
    print(f"   load generator CPU {(result['agents_cpu'] + result['coordinator_cpu']) / result['wall']:.2f} s/s (agent processes "
          f"{result['agents_cpu'] / result['wall']:.2f}, this process (user, producer, samplers) {result['coordinator_cpu'] / result['wall']:.2f}); "
          f"machine load average {result['load'][0]:.1f} at the start, {result['load'][1]:.1f} at the end")
    print(f"   after enrolment: samples begun once every agent had registered ({enrolled - result['started']:.0f} s into the run)")
    print(f"{'call':<16}{'count':>8}{'p50 ms':>10}{'p99 ms':>10}{'errors':>8}{'after enrolment: count':>24}{'p99 ms':>10}")
    for call in CALLS:
        values, steady = durations(stats, call), durations(stats, call, enrolled)
        if call == "lease":
            print(f"{'lease (all)':<16}{len(values):>8}{percentile(values, 0.5) * 1000:>10.1f}{percentile(values, 0.99) * 1000:>10.1f}"
                  f"{stats.errors.get(call, 0):>8}{len(steady):>24}{percentile(steady, 0.99) * 1000:>10.1f}  (includes the wait)")
            values, steady, call = long_poll_answers(stats), long_poll_answers(stats, enrolled), "long-poll answer"
        print(f"{call:<16}{len(values):>8}{percentile(values, 0.5) * 1000:>10.1f}{percentile(values, 0.99) * 1000:>10.1f}"
              f"{stats.errors.get(call, 0):>8}{len(steady):>24}{percentile(steady, 0.99) * 1000:>10.1f}"
              + ("  (a 204's lateness after the wait it asked for)" if call == "long-poll answer" else ""))
    latencies, unleased = dispatches(result)
    steady_dispatch, _ = dispatches(result, enrolled)
    print(f"{'dispatch':<16}{len(latencies):>8}{percentile(latencies, 0.5) * 1000:>10.1f}{percentile(latencies, 0.99) * 1000:>10.1f}"
          f"{unleased:>8}{len(steady_dispatch):>24}{percentile(steady_dispatch, 0.99) * 1000:>10.1f}  (task queued -> leased; errors = never leased)")
    whole = print_cost("whole run", cost(result, agents, result["started"]), agents)
    steady = print_cost("after enrolment", cost(result, agents, enrolled), agents)
    print_loop_lag(stats)
    for sample in stats.error_samples:
        print("  error:", sample)
    return {"kind": result["kind"], "protocol": args.protocol, "errors": sum(stats.errors.values()), "unleased": unleased,
            "user_p99_ms": percentile(durations(stats, "user GET jobs"), 0.99) * 1000,
            "user_p99_after_enrolment_ms": percentile(durations(stats, "user GET jobs", enrolled), 0.99) * 1000,
            "long_poll_answer_p99_ms": percentile(long_poll_answers(stats), 0.99) * 1000,
            "heartbeat_p99_ms": percentile(durations(stats, "heartbeat"), 0.99) * 1000,
            "dispatch_p99_ms": percentile(latencies, 0.99) * 1000, "whole": whole, "after_enrolment": steady}


def print_loop_lag(stats: Stats, slowest: int = 3) -> None:
    """The load generator's own lateness: a request timed while its loop was late is late by the
    load generator (it shares the machine's cores with the server), not by the server."""
    mine = [(due, late) for due, late in stats.loop_late if due != "agents"]
    theirs = [late for due, late in stats.loop_late if due == "agents"]
    print(f"   load generator's event loops: this process {len(mine)} of {stats.loop_ticks} 20 ms ticks late by over 5 ms "
          f"(the latest {max((late for _, late in mine), default=0.0) * 1000:.0f} ms); agent processes {len(theirs)} ticks late, "
          f"the latest {max(theirs, default=0.0) * 1000:.0f} ms")
    worst = sorted(((elapsed, began) for began, elapsed in stats.samples.get("user GET jobs", [])), reverse=True)[:slowest]
    if worst:
        print("   slowest user requests (ms), and this process's loop lateness during each: "
              + ", ".join(f"{duration * 1000:.0f} ({max((late for due, late in mine if start <= due + late and due <= start + duration), default=0.0) * 1000:.0f})"
                          for duration, start in worst))


# -- entry points ------------------------------------------------------------------------------

def arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--agent-processes", type=int, default=2, help="load-generator processes the agents are spread over")
    parser.add_argument("--protocol", choices=("longpoll", "heartbeats"), default="longpoll",
                        help="longpoll: the long-poll is the heartbeat (the agent now); heartbeats: a heartbeat every interval beside it (before)")
    parser.add_argument("--task-rate", type=float, default=2.0, help="device tasks queued per second")
    parser.add_argument("--user-rate", type=float, default=2.0,
                        help="a user's job lists per second (with --task-rate 0 and --user-rate 0 the server serves idle agents only)")
    parser.add_argument("--servers", default="asgi")
    parser.add_argument("--server-checkout", default="", help="serve from this checkout of Kiln (default: this one)")
    parser.add_argument("--database-url", default="")
    parser.add_argument("--redis-url", default="")
    # One server kind (in a child process), or one load-generator process of agents.
    parser.add_argument("--one", default="")
    parser.add_argument("--agents-process", action="store_true")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--start-at", type=float, default=0.0)
    parser.add_argument("--stop-at", type=float, default=0.0)
    parser.add_argument("--out", default="")
    return parser.parse_args(argv)


def child_arguments(args, kind: str) -> list[str]:
    return ["--one", kind, "--agents", str(args.agents), "--seconds", str(args.seconds), "--agent-processes", str(args.agent_processes),
            "--protocol", args.protocol, "--task-rate", str(args.task_rate), "--user-rate", str(args.user_rate), "--server-checkout", args.server_checkout,
            "--database-url", args.database_url, "--redis-url", args.redis_url]


def main(args) -> None:
    sys.path[:0] = [str(REPO), str(REPO / "platform")]
    scratch = Path(tempfile.mkdtemp(prefix="kiln-fleet-load-"))
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "kiln.settings", "KILN_DATA_DIR": str(scratch / "data"),
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "platform")]), "KILN_CREDENTIALS_RATE": "100000/min",
           "KILN_LOG_LEVEL": "WARNING"}
    # As `make up` serves (its pool size unless KILN_DB_POOL_SIZE is set).
    env.setdefault("KILN_DB_POOL_SIZE", "8")
    for name in ("DATABASE_URL", "REDIS_URL", "KILN_METRICS", "PROMETHEUS_MULTIPROC_DIR"):
        env.pop(name, None)
    if args.database_url:
        env["DATABASE_URL"] = args.database_url
    if args.redis_url:
        env["REDIS_URL"] = args.redis_url
    print(f"fleet_load: {args.agents} agents x {args.seconds:.0f} s ({args.protocol}), database {'PostgreSQL' if args.database_url else 'SQLite'}, "
          f"broker {'Redis' if args.redis_url else 'filesystem'}; {psutil.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
          + (f"; server from {args.server_checkout}" if args.server_checkout else ""))
    results, failed = [], []
    for kind in args.servers.split(","):
        # Each server kind in a fresh process: Django is set up once per process.
        child = subprocess.run([sys.executable, __file__, *child_arguments(args, kind)], env=env, capture_output=True, text=True, check=False)
        sys.stdout.write(child.stdout)
        if child.returncode != 0:
            sys.stderr.write(child.stderr[-3000:])
            failed.append(kind)
        results += [json.loads(line.split(" ", 1)[1]) for line in child.stdout.splitlines() if line.startswith("summary ")]
    shutil.rmtree(scratch, ignore_errors=True)
    by_kind = {result["kind"]: result for result in results}
    if {"asgi", "wsgi"} <= set(by_kind):
        asgi, wsgi = by_kind["asgi"], by_kind["wsgi"]
        print(f"\nratios WSGI/ASGI (> 1: ASGI better): user p99 {wsgi['user_p99_ms'] / asgi['user_p99_ms']:.1f}x, "
              f"server CPU per agent-minute {wsgi['after_enrolment']['cpu_ms_per_agent_minute'] / asgi['after_enrolment']['cpu_ms_per_agent_minute']:.1f}x, "
              f"errors {wsgi['errors']} vs {asgi['errors']}")
    if failed:
        # A run that could not start (a database that does not exist, a port taken) is not a result.
        sys.exit(f"fleet_load: the {', '.join(failed)} run(s) failed; see above")


def main_one(args) -> None:
    sys.path[:0] = [str(REPO), str(REPO / "platform")]
    result = run_one(args.one, args, dict(os.environ))
    print("summary", json.dumps(report(result, args)))


if __name__ == "__main__":
    parsed = arguments()
    if parsed.agents_process:
        agents_process_main(parsed)
    elif parsed.one:
        main_one(parsed)
    else:
        main(parsed)
