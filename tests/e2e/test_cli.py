"""The `kiln` command line as a user runs it: a subprocess against a live server, a Celery worker and a real agent."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

PASSWORD = "a-long-password-1"


@pytest.fixture
def kiln(kiln_stack, tmp_path):
    """Runs `kiln …` with its own config file; returns (exit code, stdout, stderr)."""
    env = {**kiln_stack.env, "KILN_CLIENT_CONFIG": str(tmp_path / "client.json"), "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("KILN_SERVER", None)
    env.pop("KILN_TOKEN", None)

    def run(*args, check: int | None = 0, timeout: float = 400):
        result = subprocess.run([sys.executable, "-m", "kiln_client.cli", *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout,
                                cwd=tmp_path)
        if check is not None:
            assert result.returncode == check, f"kiln {' '.join(map(str, args))} → {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}\n{kiln_stack.logs()}"
        return result

    return run


def test_login_upload_deploy_report_perf_and_rerun(kiln_stack, kiln, model_files, tmp_path):
    tenant = kiln_stack.create_user("cli-user", PASSWORD, "Command Line")
    kiln_stack.start_agent(tenant, "cli-box")

    login = kiln("login", "--server", kiln_stack.url, "--username", "cli-user", "--password", PASSWORD)
    assert "Signed in" in login.stdout and "cli-user" in login.stdout
    config = json.loads((tmp_path / "client.json").read_text())
    assert config["token"].startswith("kiln_pat_") and oct((tmp_path / "client.json").stat().st_mode & 0o777) == "0o600"

    model = json.loads(kiln("models", "upload", model_files["model"], "--name", "digits", "--json").stdout)
    assert model["name"] == "digits" and model["versions"][0]["op_histogram"]["Conv"] == 2
    calibration = json.loads(kiln("datasets", "upload", model_files["calibration"], "--kind", "calibration", "--json").stdout)
    validation = json.loads(kiln("datasets", "upload", model_files["validation"], "--kind", "validation", "--json").stdout)
    assert validation["has_labels"] is True

    # Deploy by model name, follow it live, download the package; exit 0: the tolerance was met on the device.
    packages = tmp_path / "packages"
    deployed = kiln("deploy", "digits", "--calibration", calibration["id"], "--validation", validation["id"], "--precision", "fp32",
                    "--precision", "int8", "--tolerance", "1%", "--target", _agent_id(tenant), "--wait", "--download", packages)
    assert "validate" in deployed.stdout and "Report ready" in deployed.stdout
    job_id = int(deployed.stdout.split("Job ", 1)[1].split(" ", 1)[0])
    [package] = list(packages.glob("*.zip"))
    with zipfile.ZipFile(package) as archive:
        assert {"manifest.json", "manifest.sig", "run.py", "model.onnx"} <= set(archive.namelist())
    # Checked against the server's key (pinned by the CLI), then run where it was unpacked.
    assert "Verified" in kiln("packages", "verify", package).stdout
    (tmp_path / "kiln.pem").write_text(kiln("packages", "signing-key").stdout)
    unpacked = _unpack(package, tmp_path / "plain")
    ran = _run_package(unpacked, model_files["validation"], "--public-key", tmp_path / "kiln.pem")
    assert ran.returncode == 0 and "p50" in ran.stdout, ran.stderr

    report = kiln("report", job_id)
    assert "cli-box" in report.stdout and "fp32" in report.stdout and "★" in report.stdout
    as_json = json.loads(kiln("report", job_id, "--json").stdout)
    device = as_json["devices"][0]
    assert device["recommended"] and device["decision"]["variant"] == device["recommended"]
    # The CLI prints the decision the server made (verdict, timing, why not the others), not one of its own.
    assert "Why not the others:" in report.stdout

    rows = json.loads(kiln("perf", "--job", job_id, "--json").stdout)
    assert {row["variant_key"] for row in rows} >= {"fp32", "int8"} and all(row["agent"]["name"] == "cli-box" for row in rows)
    # The performance database says what the decision said: one recommended row, named by what ran.
    assert [row["device_task"] for row in rows if row["recommended"]] == [device["recommended"]]
    assert {row["effective_precision"] for row in rows} <= {"fp32", "int8", "mixed"}
    assert "cli-box" in kiln("perf", "--model", model["id"]).stdout

    # A re-run repeats the job; its report names the job it repeats.
    rerun = kiln("jobs", "rerun", job_id, "--wait")
    new_id = int(rerun.stdout.split("Job ", 1)[1].split(" ", 1)[0])
    assert json.loads(kiln("report", new_id, "--json").stdout)["rerun"]["job"] == job_id
    assert str(new_id) in kiln("jobs", "list").stdout
    assert len(json.loads(kiln("perf", "--model", model["id"], "--json").stdout)) == 2 * len(rows)

    # A tolerance nothing meets: the job succeeds, the exit code says the tolerance was missed.
    # Its package is encrypted: it runs with the organization's key and not without.
    encrypted = tmp_path / "encrypted"
    missed = kiln("deploy", "digits", "--validation", validation["id"], "--precision", "int8-dynamic", "--metric", "cosine", "--tolerance", "0",
                  "--encrypt", "--wait", "--download", encrypted, check=3)
    assert "no" in missed.stdout
    [sealed] = list(encrypted.glob("*.zip"))
    unpacked = _unpack(sealed, tmp_path / "sealed")
    assert (unpacked / "model.onnx.enc").exists() and not (unpacked / "model.onnx").exists()
    key = kiln("packages", "key").stdout.strip()
    with_key = _run_package(unpacked, model_files["validation"], env={"KILN_PACKAGE_KEY": key})
    assert with_key.returncode == 0 and "p50" in with_key.stdout, with_key.stderr
    without = _run_package(unpacked, model_files["validation"], env={"KILN_PACKAGE_KEY": ""})
    assert without.returncode != 0 and "encrypted" in without.stderr
    assert "Verified" in kiln("packages", "verify", sealed).stdout
    # One changed byte and neither the CLI nor run.py accepts it.
    data = bytearray((unpacked / "model.onnx.enc").read_bytes())
    data[100] ^= 0x01
    (unpacked / "model.onnx.enc").write_bytes(bytes(data))
    assert _run_package(unpacked, model_files["validation"], env={"KILN_PACKAGE_KEY": key}).returncode == 2
    assert "verification failed" in kiln("packages", "verify", unpacked, check=1).stderr

    # Errors are one line and exit 1.
    failed = kiln("report", 999999, check=1)
    assert "error (404" in failed.stderr


def _unpack(package, directory):
    with zipfile.ZipFile(package) as archive:
        archive.extractall(directory)
    return directory


def _run_package(root, *args, env=None):
    return subprocess.run([sys.executable, "run.py", *map(str, args), "--runs", "3"], cwd=root, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def _agent_id(tenant) -> int:
    from kiln.fleet.models import Agent
    from tests.conftest import wait_until

    return wait_until(lambda: Agent.objects.filter(organization=tenant.organization, name="cli-box").values_list("id", flat=True).first(),
                      timeout=60, message="the agent to register")


def test_without_a_server_the_cli_says_how_to_log_in(tmp_path):
    env = {**os.environ, "KILN_CLIENT_CONFIG": str(tmp_path / "none.json")}
    env.pop("KILN_SERVER", None)
    result = subprocess.run([sys.executable, "-m", "kiln_client.cli", "models", "list"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "kiln login" in result.stderr
