"""The report's verdict, "why not the others" rows and unstable notes, through the real agent API, and the package README."""
from __future__ import annotations

import zipfile

import pytest

from tests.conftest import upload

from .conftest import register

pytestmark = pytest.mark.django_db(transaction=True)


def report_timings(agent, capture, timings: dict[str, tuple[float, list[float], bool, float]]) -> None:
    """Lease every task and report, per precision, the p50, the benchmark's window medians, the unstable flag and top-1 agreement."""
    while (response := agent.post("/api/agent/v1/tasks/lease", {"wait_s": 0}, format="json")).status_code == 200:
        task = response.json()
        p50, windows, unstable, top1 = timings[task["variant"]["precision"]]
        latency = {"p50": p50, "p90": p50, "p99": p50, "mean": p50, "std": 0.01 * p50, "cv": 0.01, "count": 200}
        result = {"attempt": task["attempt"], "status": "succeeded", "error": "",
                  "metrics": {"latency_ms": latency, "runs": 200, "unstable": unstable, "threads": 1, "batch_size": 1,
                              "by_batch": [{"batch_size": 1, "latency_ms": latency, "runs": 200, "unstable": unstable, "window_medians_ms": windows}]},
                  "accuracy": {"cosine": 1.0, "sqnr_db": 90.0, "top1_agreement": top1, "max_abs_error": 0.0}}
        with capture(execute=True):
            assert agent.post(f"/api/agent/v1/tasks/{task['id']}/result", result, format="json").status_code == 200


def deploy(tenant, model_files, capture, timings) -> dict:
    agent = register(tenant, "noisy-box")
    version = upload(tenant.client, "/api/v1/models/", model_files["model"], name="digits").json()["versions"][0]["id"]
    with capture(execute=True):
        job = tenant.client.post("/api/v1/jobs/", {"model_version": version, "precisions": sorted(timings)}, format="json").json()
    report_timings(agent, capture, timings)
    report = tenant.client.get(f"/api/v1/jobs/{job['id']}/report/").json()
    assert report["status"] == "succeeded", report
    return report


def variant_of(device: dict, precision: str) -> dict:
    return next(v for v in device["variants"] if v["precision"] == precision)


def test_an_unstable_speed_up_with_a_wide_interval_is_too_noisy_to_tell_and_fp32_stays(tenant, model_files, django_capture_on_commit_callbacks, tmp_path):
    report = deploy(tenant, model_files, django_capture_on_commit_callbacks, {
        "fp32": (0.023, [0.023, 0.0231, 0.0229], False, 1.0),
        "fp16": (0.021, [0.019, 0.021, 0.025], True, 0.999),
    })
    device = report["devices"][0]
    assert device["recommended"] == variant_of(device, "fp32")["id"]
    noisy = "too noisy to tell: 0.82x to 1.46x; re-run on a quieter device"
    assert device["verdict"]["tie"] and noisy in device["verdict"]["text"], [(v["precision"], v["error"], v["status"]) for v in device["variants"]]
    assert "a tie within noise" not in device["verdict"]["text"] and device["verdict"]["tied_with"][0]["too_noisy"]
    assert device["reason"] == device["verdict"]["text"]
    assert [row["family"] for row in device["alternatives"]] == ["fp16"]
    assert device["alternatives"][0]["why"].endswith(noisy)
    [listed] = tenant.client.get("/api/v1/jobs/").json()["results"]
    assert listed["outcome"][0]["tie"] and listed["outcome"][0]["too_noisy"]
    assert device["unstable"][0]["variant"] == variant_of(device, "fp16")["id"] and "0.019, 0.021, 0.025 ms" in device["unstable"][0]["text"]

    package = tenant.client.get(device["package"]["download_url"])
    path = tmp_path / "package.zip"
    path.write_bytes(b"".join(package.streaming_content))
    readme = zipfile.ZipFile(path).read("README.md").decode()
    assert f"Verdict: {device['verdict']['text']}" in readme
    assert "| fp16 | fp16 on onnxruntime | 0.021 | " in readme and "was unstable" in readme


def test_a_steady_speed_up_wins_with_a_one_line_verdict(tenant, model_files, django_capture_on_commit_callbacks):
    report = deploy(tenant, model_files, django_capture_on_commit_callbacks, {
        "fp32": (2.0, [2.0, 2.01, 1.99], False, 1.0),
        "int8-dynamic": (1.0, [1.0, 1.01, 0.99], False, 0.998),
    })
    device = report["devices"][0]
    int8 = variant_of(device, "int8-dynamic")
    assert device["recommended"] == int8["id"]
    assert device["verdict"]["text"].startswith(f"Use {int8['key']} on onnxruntime: 2.00x faster than FP32 (1 vs 2 ms)")
    assert device["alternatives"][0]["why"] == "slower: 0.50x the recommended's speed"
    assert device["unstable"] == []


def test_the_deployments_list_carries_each_devices_outcome_and_filters_by_model(tenant, other_tenant, model_files, django_capture_on_commit_callbacks):
    report = deploy(tenant, model_files, django_capture_on_commit_callbacks, {
        "fp32": (2.0, [2.0, 2.01, 1.99], False, 1.0),
        "int8-dynamic": (1.0, [1.0, 1.01, 0.99], False, 0.998),
    })
    model = tenant.client.get(f"/api/v1/jobs/{report['job']}/").json()["model"]["id"]
    listed = tenant.client.get(f"/api/v1/jobs/?model={model}").json()["results"]
    assert [job["id"] for job in listed] == [report["job"]]
    outcome = listed[0]["outcome"]
    assert outcome == [{"device": "noisy-box", "agent": report["devices"][0]["agent"]["id"], "recommended": "int8-dynamic on onnxruntime",
                        "speedup": 2.0, "beyond_noise": True, "tie": False, "too_noisy": False, "accuracy": {"metric": "top1_agreement", "value": 0.998, "drop": pytest.approx(0.002)},
                        "verdict": report["devices"][0]["verdict"]["text"]}]
    assert tenant.client.get(f"/api/v1/jobs/?model={model + 1000}").json()["results"] == []
    assert tenant.client.get("/api/v1/jobs/?model=abc").status_code == 400
    assert other_tenant.client.get(f"/api/v1/jobs/?model={model}").json()["results"] == []
    tasks = tenant.client.get(f"/api/v1/jobs/{report['job']}/").json()["device_tasks"]
    assert {task["agent"]["name"] for task in tasks} == {"noisy-box"}
