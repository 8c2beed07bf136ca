import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

from devices.agent.client import AgentClient, RetryPolicy
from devices.agent.config import AgentConfig, save_config
from devices.agent.loop import Agent, jittered

from .conftest import Answer

ROOT = Path(__file__).resolve().parents[2]
HEARTBEAT = "/api/agent/v1/heartbeat"
LEASE = "/api/agent/v1/tasks/lease"
LONG_BENCHMARK = {"warmup_runs": 1, "warmup_seconds": 0, "min_runs": 10**9, "min_seconds": 600}


def _config(agent_server, **overrides) -> AgentConfig:
    values = dict(server=agent_server.url, agent_id=1, agent_token="kiln_agt_t", name="test",
                  heartbeat_interval_s=0.2, poll_interval_s=0.2, long_poll_s=1.0)
    values.update(overrides)
    return AgentConfig(**values)


def _agent(agent_server, tmp_path, **overrides) -> Agent:
    config = _config(agent_server, **overrides)
    client = AgentClient(config.server, config.agent_token, sleep=lambda s: None,
                         retry=RetryPolicy(max_attempts=2, base_s=0.0, cap_s=0.0))
    return Agent(config, tmp_path / "work", client=client, threads=1)


def _lease_once(task):
    answers = [Answer(200, task)]
    return lambda request: answers.pop() if answers else Answer(204)


def test_jitter_stays_within_ten_percent():
    values = [jittered(10.0) for _ in range(500)]
    assert all(9.0 <= value <= 11.0 for value in values)
    assert len(set(values)) > 1


def test_once_runs_one_task_and_reports_it(agent_server, tiny_task_files, tmp_path):
    task = agent_server.serve_task(21, tiny_task_files)
    agent_server.route("POST", HEARTBEAT, Answer(200, {"cancel": [], "heartbeat_interval_s": 0.2}))
    agent_server.route("POST", LEASE, _lease_once(task))
    assert _agent(agent_server, tmp_path).run(once=True) == 0
    assert agent_server.results(21)[0]["status"] == "succeeded"
    heartbeat = agent_server.hits("POST", HEARTBEAT)[0].json()
    assert heartbeat["running_task"] is None and "runtimes" in heartbeat["capabilities"]
    # The server's long-poll, up to 10 % shorter (jitter: a fleet started together drifts apart).
    assert 0.9 <= agent_server.hits("POST", LEASE)[0].json()["wait_s"] <= 1.0


def test_an_idle_agent_sends_no_heartbeat_while_it_long_polls(agent_server, tmp_path):
    agent_server.route("POST", HEARTBEAT, Answer(200, {"cancel": [], "heartbeat_interval_s": 0.1}))

    def long_poll(request):
        time.sleep(request.json()["wait_s"])
        return Answer(204)

    agent_server.route("POST", LEASE, long_poll)
    agent = _agent(agent_server, tmp_path, heartbeat_interval_s=0.1, long_poll_s=0.4)
    threading.Timer(1.5, agent.stop_event.set).start()
    assert agent.run() == 0
    # The first call says who it is (capabilities); then only long-polls, each the agent's heartbeat.
    assert len(agent_server.hits("POST", HEARTBEAT)) == 1
    assert len(agent_server.hits("POST", LEASE)) >= 3


def test_the_agent_takes_the_intervals_a_lease_answer_announces(agent_server, tmp_path):
    agent_server.route("POST", HEARTBEAT, Answer(200, {"cancel": []}))
    agent_server.route("POST", LEASE, Answer(204, headers={"Kiln-Long-Poll": "30", "Kiln-Heartbeat-Interval": "12",
                                                           "Kiln-Poll-Interval": "0.3"}))
    agent = _agent(agent_server, tmp_path, long_poll_s=0.2)
    threading.Timer(1.0, agent.stop_event.set).start()
    assert agent.run() == 0
    waits = [hit.json()["wait_s"] for hit in agent_server.hits("POST", LEASE)]
    assert 0.18 <= waits[0] <= 0.2 and all(27 <= wait <= 30 for wait in waits[1:]) and len(waits) >= 2
    assert (agent.long_poll_s, agent.heartbeat_interval_s, agent.poll_interval_s) == (30, 12, 0.3)


def test_heartbeat_cancel_aborts_the_running_task(agent_server, tiny_task_files, tmp_path):
    task = agent_server.serve_task(22, tiny_task_files, benchmark=LONG_BENCHMARK)
    agent_server.route("POST", HEARTBEAT, lambda request: Answer(
        200, {"cancel": [22] if request.json()["running_task"] == 22 else []}))
    agent_server.route("POST", LEASE, _lease_once(task))
    started = time.monotonic()
    assert _agent(agent_server, tmp_path).run(once=True) == 0
    assert time.monotonic() - started < 10
    assert agent_server.results(22) == []


def test_401_stops_the_agent_with_exit_code_3(agent_server, tmp_path):
    agent_server.route("POST", HEARTBEAT, Answer(200, {"cancel": []}))
    agent_server.route("POST", LEASE, Answer(401, {"error": "agent revoked"}))
    assert _agent(agent_server, tmp_path).run() == 3


def test_server_errors_back_off_instead_of_spinning(agent_server, tmp_path):
    agent_server.route("POST", HEARTBEAT, Answer(200, {"cancel": []}))
    agent_server.route("POST", LEASE, Answer(503))
    agent = _agent(agent_server, tmp_path, poll_interval_s=0.3)
    threading.Timer(1.0, agent.stop_event.set).start()
    assert agent.run() == 0
    assert len(agent_server.hits("POST", LEASE)) <= 2 * 4  # 2 tries per call, ≥ 0.27 s apart


def test_early_204s_are_paced_by_the_poll_interval(agent_server, tmp_path):
    agent_server.route("POST", HEARTBEAT, Answer(200, {"cancel": []}))
    agent_server.route("POST", LEASE, Answer(204))
    agent = _agent(agent_server, tmp_path, poll_interval_s=0.3, long_poll_s=20)
    threading.Timer(1.0, agent.stop_event.set).start()
    assert agent.run() == 0
    assert len(agent_server.hits("POST", LEASE)) <= 5


# -- the CLI, as a real process --------------------------------------------------------------


def _cli(*args, env=None, **kwargs):
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "devices.agent", *args], cwd=ROOT, env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def test_register_writes_a_private_config(agent_server, tmp_path):
    agent_server.route("POST", "/api/agent/v1/register", Answer(201, {
        "agent_id": 7, "agent_token": "kiln_agt_secret", "heartbeat_interval_s": 5,
        "poll_interval_s": 2, "long_poll_s": 25, "lease_seconds": 60}))
    config = tmp_path / "cfg" / "agent.json"
    process = _cli("register", "--server", agent_server.url + "/", "--registration-token", "kiln_reg_x",
                   "--name", "box", "--label", "arch=x86", "--label", "rack=2",
                   env={"KILN_AGENT_CONFIG": str(config), "KILN_AGENT_BACKENDS": "onnxruntime"})
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "kiln_agt_secret" not in stdout + stderr
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    saved = json.loads(config.read_text())
    assert saved["agent_id"] == 7 and saved["agent_token"] == "kiln_agt_secret"
    assert saved["server"] == agent_server.url and saved["long_poll_s"] == 25
    body = agent_server.hits("POST", "/api/agent/v1/register")[0].json()
    assert body["registration_token"] == "kiln_reg_x" and body["name"] == "box"
    assert body["labels"] == {"arch": "x86", "rack": "2"}
    assert set(body["capabilities"]["runtimes"]) == {"onnxruntime"}


def test_register_with_a_bad_token_exits_3(agent_server, tmp_path):
    agent_server.route("POST", "/api/agent/v1/register", Answer(401, {"error": "unknown registration token"}))
    process = _cli("register", "--server", agent_server.url, "--registration-token", "bad", "--name", "n",
                   "--config", str(tmp_path / "agent.json"))
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 3
    assert "unknown registration token" in stderr
    assert not (tmp_path / "agent.json").exists()


def test_capabilities_command_prints_json():
    process = _cli("capabilities", env={"KILN_AGENT_BACKENDS": "onnxruntime"})
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert json.loads(stdout)["runtimes"].keys() == {"onnxruntime"}


def _wait_for(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def _start_agent(agent_server, tmp_path):
    config = save_config(_config(agent_server, long_poll_s=5.0), tmp_path / "agent.json")
    return _cli("run", "--config", str(config), "--work-dir", str(tmp_path / "work"))


def test_sigterm_while_idle_exits_0_promptly(agent_server, tmp_path):
    agent_server.route("POST", HEARTBEAT, Answer(200, {"cancel": []}))

    def slow_204(request):
        time.sleep(request.json()["wait_s"])
        return Answer(204)

    agent_server.route("POST", LEASE, slow_204)
    process = _start_agent(agent_server, tmp_path)
    _wait_for(lambda: agent_server.hits("POST", LEASE))
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=4)
    assert process.returncode == 0, stderr


def test_sigterm_during_benchmark_hands_the_task_back(agent_server, tiny_task_files, tmp_path):
    task = agent_server.serve_task(23, tiny_task_files, benchmark=LONG_BENCHMARK)
    agent_server.route("POST", HEARTBEAT, Answer(200, {"cancel": []}))
    agent_server.route("POST", LEASE, _lease_once(task))
    process = _start_agent(agent_server, tmp_path)
    _wait_for(lambda: any(r.json()["stage"] == "benchmark"
                          for r in agent_server.hits("POST", "/api/agent/v1/tasks/23/progress")))
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=20)
    assert process.returncode == 0, stderr
    [result] = agent_server.results(23)
    assert result["status"] == "handed_back" and result["error"] == "agent stopping"


def test_run_with_a_revoked_token_exits_3(agent_server, tmp_path):
    agent_server.route("POST", HEARTBEAT, Answer(401, {"error": "agent revoked"}))
    process = _start_agent(agent_server, tmp_path)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 3
    assert "register the agent again" in stderr


def test_register_without_a_token_says_what_to_set(tmp_path):
    process = _cli("register", "--server", "http://127.0.0.1:9", "--config", str(tmp_path / "a.json"),
                   env={"KILN_AGENT_REGISTRATION_TOKEN": ""})
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2
    assert "KILN_AGENT_REGISTRATION_TOKEN" in stderr


def test_the_agent_imports_neither_django_nor_the_server():
    code = (
        "import sys, devices.agent.cli, devices.agent.loop, devices.agent.runner, kiln_contract.metrics, "
        "devices.bench, devices.backends.registry\n"
        "devices.backends.registry.available_backends()\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'django', 'kiln', 'workers', 'celery'})\n"
        "print(bad)\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[]"
