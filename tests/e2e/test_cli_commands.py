"""`kiln devices`, `kiln jobs show/wait`, `kiln report` on a running job and `--json`, run as a user would:
subprocesses against a live server and Celery worker, with a scripted agent answering over the real agent API
(so that the job stays running until the test lets it finish)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import requests

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def run_kiln(env, tmp_path, *args, check: int | None = 0, columns: int = 200):
    result = subprocess.run([sys.executable, "-m", "kiln_client.cli", *map(str, args)], env={**env, "COLUMNS": str(columns)}, capture_output=True,
                            text=True, timeout=300, cwd=tmp_path)
    if check is not None:
        assert result.returncode == check, f"kiln {' '.join(map(str, args))} → {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def logged_in(kiln_stack, tmp_path, username: str, organization: str) -> dict:
    """A new user's environment for `kiln`, signed in with its API token (its own config file)."""
    tenant = kiln_stack.create_user(username, "a-long-password-1", organization)
    env = {**kiln_stack.env, "KILN_CLIENT_CONFIG": str(tmp_path / "client.json"), "NO_COLOR": "1"}
    env.pop("KILN_SERVER", None)
    env.pop("KILN_TOKEN", None)
    run_kiln(env, tmp_path, "login", "--server", kiln_stack.url, "--token", tenant.token)
    return env


def scripted_agent(url: str, secret: str, name: str) -> requests.Session:
    body = requests.post(f"{url}/api/agent/v1/register", timeout=30, json={
        "registration_token": secret, "name": name,
        "capabilities": {"runtimes": {"onnxruntime": "1.32.0"}, "cores": 2, "cpu_model": "Scripted CPU", "agent_version": "0.1.0"}}).json()
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {body['agent_token']}"
    return session


def answer_one_task(url: str, agent: requests.Session, p50_by_precision: dict) -> bool:
    response = agent.post(f"{url}/api/agent/v1/tasks/lease", json={"wait_s": 1}, timeout=30)
    if response.status_code != 200:
        return False
    task = response.json()
    p50 = p50_by_precision[task["variant"]["precision"]]
    latency = {"p50": p50, "p90": p50, "p99": p50, "mean": p50, "std": 0.01 * p50, "cv": 0.01, "count": 200}
    result = {"attempt": task["attempt"], "status": "succeeded", "error": "",
              "metrics": {"latency_ms": latency, "runs": 200, "unstable": False, "threads": 1, "batch_size": 1,
                          "by_batch": [{"batch_size": 1, "latency_ms": latency, "runs": 200, "unstable": False, "window_medians_ms": [p50] * 3}]},
              "accuracy": {"cosine": 1.0, "sqnr_db": 90.0, "top1_agreement": 1.0, "max_abs_error": 0.0}}
    assert agent.post(f"{url}/api/agent/v1/tasks/{task['id']}/result", json=result, timeout=30).status_code == 200
    return True


def test_devices_jobs_show_wait_and_report_while_running(kiln_stack, model_files, tmp_path):
    env = logged_in(kiln_stack, tmp_path, "cli-scripts", "Scripts")

    # No device yet: the CLI says how to add one, and prints the commands a device runs.
    assert "kiln devices add" in run_kiln(env, tmp_path, "devices").stdout
    added = json.loads(run_kiln(env, tmp_path, "devices", "add", "lab", "--json").stdout)
    assert added["install_command"].endswith(" kiln-agent onnxruntime") and "/downloads/" in added["install_command"]
    assert added["up_command"].startswith(f"kiln-agent up --server {kiln_stack.url} --registration-token kiln_reg_")
    # The live server is on 127.0.0.1: the plain output warns that a device cannot use that address.
    plain = run_kiln(env, tmp_path, "devices", "add", "lab-2")
    assert "loopback" in plain.stderr and "2. kiln-agent up --server" in plain.stdout

    agent = scripted_agent(kiln_stack.url, added["token"], "scripted-orin")
    assert agent.post(f"{kiln_stack.url}/api/agent/v1/heartbeat", json={"capabilities": {"runtimes": {"onnxruntime": "1.32.0"}}}, timeout=30).ok
    listed = json.loads(run_kiln(env, tmp_path, "devices", "--json").stdout)
    assert [device["name"] for device in listed] == ["scripted-orin"]
    assert "scripted-orin" in run_kiln(env, tmp_path, "devices").stdout

    deployed = json.loads(run_kiln(env, tmp_path, "deploy", model_files["model"], "--precision", "fp32", "--precision", "int8-dynamic",
                                   "--metric", "cosine", "--tolerance", "1%", "--json").stdout)
    job_id = deployed["id"]
    assert deployed["tolerance"] == {"metric": "cosine", "max_drop": 0.01}

    # Until the agent answers, the job has no report: said on stderr, exit 4 (and --json still prints what there is).
    from tests.conftest import wait_until

    wait_until(lambda: json.loads(run_kiln(env, tmp_path, "jobs", "show", job_id, "--json").stdout)["status"] not in ("queued",), timeout=120,
               message="the job to start")
    running = run_kiln(env, tmp_path, "report", job_id, check=4)
    assert f"Job {job_id} is still" in running.stderr and f"kiln jobs wait {job_id}" in running.stderr and running.stdout == ""
    assert json.loads(run_kiln(env, tmp_path, "report", job_id, "--json", check=4).stdout)["status"] != "succeeded"
    shown = run_kiln(env, tmp_path, "jobs", "show", job_id).stdout
    assert f"Job {job_id}" in shown and "validate" in shown

    # `kiln jobs wait` follows it while the scripted agent answers; it ends with the report and exit 0.
    waiter = subprocess.Popen([sys.executable, "-m", "kiln_client.cli", "jobs", "wait", str(job_id)], env={**env, "COLUMNS": "80"}, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while waiter.poll() is None and time.monotonic() < deadline:
            answer_one_task(kiln_stack.url, agent, {"fp32": 2.0, "int8-dynamic": 1.0})
        out, err = waiter.communicate(timeout=60)
    finally:
        if waiter.poll() is None:
            waiter.kill()
    assert waiter.returncode == 0, f"{out}\n{err}\n{kiln_stack.logs()}"
    assert "★" in out and all(len(line) <= 80 for line in out.splitlines() if "│" not in line), out

    report = run_kiln(env, tmp_path, "report", job_id, columns=80).stdout
    starred = [line for line in report.splitlines() if line.startswith("★ ")]
    assert starred and any(key in starred[0] for key in ("fp32", "int8-dynamic")), report
    assert json.loads(run_kiln(env, tmp_path, "jobs", "wait", job_id, "--json").stdout)["status"] == "succeeded"
    assert "took" in run_kiln(env, tmp_path, "jobs", "show", job_id).stdout


def jpeg_folder(root, *, count: int = 6):
    """A folder of JPEG photos in class folders, as a user has them (no NumPy anywhere)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(1)
    for index in range(count):
        folder = root / ("three" if index % 2 else "seven")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), "RGB").save(folder / f"scan-{index}.jpg")
    return root


def test_a_folder_of_jpegs_becomes_a_dataset_through_the_recipe_the_model_proposes(kiln_stack, model_files, tmp_path):
    env = logged_in(kiln_stack, tmp_path, "cli-photos", "Photos")
    run_kiln(env, tmp_path, "models", "upload", model_files["model"], "--name", "digits")
    photos = jpeg_folder(tmp_path / "photos")

    # The proposal on its own: JSON on stdout (to edit), the reasons on stderr.
    proposed = run_kiln(env, tmp_path, "datasets", "recipe", "digits")
    recipe = json.loads(proposed.stdout)
    assert (recipe["input"], recipe["size"], recipe["color"], recipe["layout"]) == ("input", [8, 8], "L", "NCHW")
    assert "NCHW, 1 channel" in proposed.stderr

    # A folder, proposed from the model, previewed, checked and uploaded: labels from the class folders.
    uploaded = run_kiln(env, tmp_path, "datasets", "upload", photos, "--kind", "validation", "--for-model", "digits", "--json")
    dataset = json.loads(uploaded.stdout)
    assert dataset["samples"] == 6 and dataset["has_labels"] is True and dataset["arrays"]["input"]["shape"] == [6, 1, 8, 8]
    assert "Preview of 4 of 6 files: each becomes input [1, 8, 8] float32" in uploaded.stderr

    # A recipe that does not fit the model is refused after the preview, before the upload, with what is wrong.
    (tmp_path / "wrong.json").write_text(json.dumps({**recipe, "size": [16, 16]}))
    refused = run_kiln(env, tmp_path, "datasets", "upload", photos, "--kind", "validation", "--for-model", "digits",
                       "--recipe", tmp_path / "wrong.json", check=1)
    assert "does not fit the model" in refused.stderr and "16 where it needs 8" in refused.stderr

    # Raw files without a model or a recipe: the CLI says what to add (no NumPy).
    bare = run_kiln(env, tmp_path, "datasets", "upload", photos, "--kind", "calibration", check=2)
    assert "--for-model" in bare.stderr

    # deploy takes the folders directly: the recipe comes from the model being deployed.
    job = json.loads(run_kiln(env, tmp_path, "deploy", "digits", "--calibration", photos, "--validation", photos, "--precision", "fp32",
                              "--json").stdout)
    assert job["calibration_dataset"] and job["validation_dataset"]
    assert len(json.loads(run_kiln(env, tmp_path, "datasets", "list", "--json").stdout)) == 3


def test_deploy_takes_the_search_budget_and_the_lists_fit_80_columns_while_a_search_runs(kiln_stack, model_files, tmp_path):
    """Issue 37 (item 6) and issue 33 (the form and `kiln deploy` take the budget): `kiln deploy --budget`, bare `kiln jobs`
    and `kiln devices` at 80 columns with names and times whole, and `kiln report --json` on a search still running says so."""
    env = logged_in(kiln_stack, tmp_path, "cli-budget", "Budgets")
    added = json.loads(run_kiln(env, tmp_path, "devices", "add", "lab", "--json").stdout)
    agent = scripted_agent(kiln_stack.url, added["token"], "jetson-orin-nano-lab-bench-2")
    assert agent.post(f"{kiln_stack.url}/api/agent/v1/heartbeat", json={"capabilities": {"runtimes": {"onnxruntime": "1.32.0"}}}, timeout=30).ok
    run_kiln(env, tmp_path, "models", "upload", model_files["model"], "--name", "digits-classifier-for-the-lab")

    refused = run_kiln(env, tmp_path, "deploy", "digits-classifier-for-the-lab", "--precision", "fp32", "--budget", "3", check=2)
    assert "--budget is the auto search's time budget" in refused.stderr
    deployed = json.loads(run_kiln(env, tmp_path, "deploy", "digits-classifier-for-the-lab", "--calibration", model_files["calibration"],
                                   "--budget", "3", "--json").stdout)
    job_id = deployed["id"]
    assert deployed["precisions"] == ["auto"] and deployed["budget"]["minutes"] == 3

    # The search runs (nothing answers for the device): its report says it is running, not that it ended.
    running = json.loads(run_kiln(env, tmp_path, "report", job_id, "--json", check=4).stdout)
    assert running["status"] not in ("succeeded", "failed", "canceled") and running["search"]["auto"] is True
    assert "ended" not in running["search"]["sensitivity_note"] and "still running" in running["search"]["sensitivity_note"]

    # `kiln jobs` alone lists; at 80 columns the model's name and the time are whole, the time relative.
    listed = run_kiln(env, tmp_path, "jobs", columns=80).stdout
    lines = listed.splitlines()
    assert all(len(line) <= 80 for line in lines) and "…" not in listed, listed
    assert any(str(job_id) in line and "digits-classifier-for-the-lab" in line and ("ago" in line or "just now" in line) for line in lines), listed
    devices = run_kiln(env, tmp_path, "devices", columns=80).stdout
    assert all(len(line) <= 80 for line in devices.splitlines()) and "…" not in devices, devices
    assert any("jetson-orin-nano-lab-bench-2" in line and ("ago" in line or "just now" in line) for line in devices.splitlines()), devices
    run_kiln(env, tmp_path, "jobs", "cancel", job_id)
