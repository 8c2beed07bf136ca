"""The agent on Arm64 without Arm hardware: a real aarch64 Python (Debian's python3.11:arm64) under QEMU user-mode
emulation, with the agent wheel this server serves and PyPI's aarch64 wheels (onnxruntime, numpy), registers with the
real server and finishes a small job: lease, compile, benchmark, evaluate, result.

`bash distributions/arm64/setup.sh` prepares the emulator, the sysroot and the aarch64 wheelhouse (.ci/run does, and
sets KILN_REQUIRE_ARM64=1 so that a missing setup fails here instead of skipping). Nothing is downloaded at test time.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from kiln.pipeline.models import DeviceTask
from kiln.reports.models import Measurement
from tests.conftest import REPO, wait_until
from tests.e2e.test_pipeline_stack import Api

ARM64_ROOT = Path(os.environ.get("KILN_ARM64_ROOT") or REPO / "var" / "arm64").resolve()
QEMU = shutil.which("qemu-aarch64-static")
READY = bool(QEMU) and (ARM64_ROOT / ".ready").exists()
SETUP = "bash distributions/arm64/setup.sh (as root: it installs qemu-user-static; .ci/run runs it)"
AARCH64_PLATFORMS = ["manylinux_2_28_aarch64", "manylinux_2_27_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64"]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
if not READY and not os.environ.get("KILN_REQUIRE_ARM64"):
    pytestmark.append(pytest.mark.skip(reason=f"no aarch64 emulation prepared under {ARM64_ROOT}: run {SETUP}"))


@pytest.fixture
def served_wheels(settings, tmp_path):
    """The server serves the contract, agent and client wheels built from this tree."""
    assert READY, f"KILN_REQUIRE_ARM64 is set but no aarch64 emulation is prepared under {ARM64_ROOT}: run {SETUP}"
    sys.path.insert(0, str(REPO / "distributions"))
    try:
        from build import build
    finally:
        sys.path.remove(str(REPO / "distributions"))
    settings.DOWNLOADS_DIR = tmp_path / "downloads"
    build(settings.DOWNLOADS_DIR)
    return settings.DOWNLOADS_DIR


def _emulated(site: Path, *args: str) -> list[str]:
    # -P: the working directory is not put on sys.path, so only the installed wheel's `devices` can be imported.
    return [QEMU, "-L", str(ARM64_ROOT / "root"), str(ARM64_ROOT / "root/usr/bin/python3.11"), "-P", *args]


def _install_from_server(url: str, target: Path, download_dir: Path) -> None:
    """What a device does: fetch the agent wheel and the contract it requires from the Kiln it talks to, install them
    with their aarch64 dependencies."""
    listing = requests.get(f"{url}/api/v1/downloads/", timeout=30).json()
    wheels = []
    for distribution in ("contract", "agent"):
        row = next(row for row in listing["files"] if row["distribution"] == distribution)
        wheels.append(download_dir / row["name"])
        wheels[-1].write_bytes(requests.get(row["url"], timeout=60).content)
    platforms = [flag for platform in AARCH64_PLATFORMS for flag in ("--platform", platform)]
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--no-index", "--find-links", str(ARM64_ROOT / "wheelhouse"),
                    "--target", str(target), "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
                    *platforms, *map(str, wheels)], check=True, timeout=300, capture_output=True)


def test_an_emulated_aarch64_agent_installs_from_the_server_and_finishes_a_job(kiln_stack, served_wheels, model_files, tmp_path, settings):
    # The suite's 8 s lease is for agents that run natively: under QEMU, beside CI's other shards, the emulated agent's
    # first stage outlasted it three times in a row (CI, 2026-12-07; heartbeats did not extend a lease then). Half the default.
    settings.AGENT_LEASE_SECONDS = 60
    tenant = kiln_stack.create_user("arm", "a-long-password-1", "Arm Devices")
    api = Api(kiln_stack.url, tenant.token)
    site = tmp_path / "aarch64-site"
    _install_from_server(kiln_stack.url, site, tmp_path)
    assert (site / "devices" / "agent" / "runner.py").exists() and (site / "kiln_contract" / "metrics.py").exists() and list(site.glob("onnxruntime-*.dist-info"))
    assert not list(site.glob("[Dd]jango*")) and not (site / "kiln").exists() and not (site / "workers").exists() and not (site / "kiln_client").exists()

    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(site), "KILN_AGENT_CONFIG": str(tmp_path / "agent.json"), "HOME": str(tmp_path)}
    subprocess.run(_emulated(site, "-m", "devices.agent", "register", "--server", kiln_stack.url, "--registration-token",
                             kiln_stack.registration_token(tenant), "--name", "arm64-emulated"),
                   env=env, cwd=tmp_path, check=True, capture_output=True, timeout=300)
    log = open(tmp_path / "agent-arm64.log", "ab")
    agent = subprocess.Popen(_emulated(site, "-m", "devices.agent", "run", "--work-dir", str(tmp_path / "work")), env=env, cwd=tmp_path,
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    agent.log_path = tmp_path / "agent-arm64.log"
    kiln_stack.processes.append(agent)

    [registered] = wait_until(lambda: [a for a in api.get("/api/v1/agents/").json() if a["online"]], timeout=180, message="the arm64 agent online")
    capabilities = registered["capabilities"]
    assert capabilities["arch"] == "aarch64" and capabilities["runtimes"]["onnxruntime"]
    # Arm ISA features from the kernel's HWCAP words (QEMU's emulated CPU has dot product, i8mm, bf16 and SVE).
    assert {"asimd", "asimddp", "i8mm", "bf16", "sve"} <= set(capabilities["isa"])
    assert "emulator" in capabilities["emulated"]

    model = api.upload("/api/v1/models/", model_files["model"], name="digits")
    validation = api.upload("/api/v1/datasets/", model_files["validation"], name="val", kind="validation")
    job = api.post("/api/v1/jobs/", json={"model_version": model["versions"][0]["id"], "precisions": ["fp32"], "targets": [registered["id"]],
                                          "validation_dataset": validation["id"]})
    job = api.wait_for_job(job["id"], kiln_stack, timeout=600)
    assert job["status"] == "succeeded", (job["error"], job["events"], kiln_stack.logs())

    [task] = DeviceTask.objects.filter(job_id=job["id"])
    assert task.status == "succeeded" and task.leased_by.name == "arm64-emulated" and task.backend == "onnxruntime"
    assert task.metrics["latency_ms"]["p50"] > 0 and task.accuracy["accuracy"] > 0.9
    assert task.support["verdict"] == "runs"
    # Timings taken under emulation are the emulator's: marked, said in the job's log, kept out of the performance database.
    assert "emulator" in task.metrics["emulated"]
    assert any("ran emulated" in event["message"] for event in job["events"])
    assert not Measurement.objects.filter(device_task=task).exists()
