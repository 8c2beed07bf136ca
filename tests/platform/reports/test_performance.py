"""The performance database: every measurement kept, tenant-scoped, regressions flagged, re-runs compared, estimates."""
from __future__ import annotations

import onnx
import pytest

from kiln.pipeline.models import JobEvent
from kiln.reports.models import Measurement
from tests.conftest import upload
from tests.fixtures.models import build_transformer_like

from .conftest import CAPABILITIES, measure

# Transactional: the agent lease long-poll reads the database from executor threads (see tests/platform/fleet).
pytestmark = pytest.mark.django_db(transaction=True)

def test_each_measurement_outlives_its_job_with_its_context(tenant, measured_job):
    row = Measurement.objects.get()
    assert row.job_id == measured_job["job"] and row.p50_ms == 1.0 and row.backend == "onnxruntime"
    assert row.backend_version == "1.32.0" and row.agent_version == "0.1.0" and row.device_key == "bench-box|Test CPU"
    assert row.op_histogram["Conv"] == 2 and row.op_work["Conv"] > 0 and row.compile_options["threads"] == 1
    listed = tenant.client.get("/api/v1/performance/", {"model": row.model_id, "backend": "onnxruntime"}).json()
    assert listed["count"] == 1 and listed["results"][0]["latency_ms"]["p50"] == 1.0
    assert tenant.client.get("/api/v1/performance/", {"backend": "openvino"}).json()["count"] == 0
    assert tenant.client.get("/api/v1/performance/", {"model": "x"}).json()["code"] == "invalid_filter"


def test_other_organizations_see_none_of_it(measured_job, other_tenant):
    assert other_tenant.client.get("/api/v1/performance/").json()["count"] == 0
    assert other_tenant.client.get("/api/v1/performance/estimate/", {"model_version": measured_job["version"]}).status_code == 404
    assert other_tenant.client.post(f"/api/v1/jobs/{measured_job['job']}/rerun/").status_code == 404


def test_a_slower_rerun_is_flagged_on_the_job_the_database_and_the_events(tenant, measured_job, django_capture_on_commit_callbacks):
    # The device's runtime changed between the runs; the re-run's report says so.
    upgraded = {**CAPABILITIES, "runtimes": {"onnxruntime": "1.33.0"}}
    measured_job["agent"].post("/api/agent/v1/heartbeat", {"capabilities": upgraded}, format="json")
    with django_capture_on_commit_callbacks(execute=True):
        rerun = tenant.client.post(f"/api/v1/jobs/{measured_job['job']}/rerun/")
    assert rerun.status_code == 201 and rerun.json()["rerun_of"] == measured_job["job"]
    assert rerun.json()["toolchain"]["host"]["onnxruntime"]
    measure(measured_job["agent"], django_capture_on_commit_callbacks, p50=1.5, std=0.02)
    report = tenant.client.get(f"/api/v1/jobs/{rerun.json()['id']}/report/").json()
    variant = report["devices"][0]["variants"][0]
    assert variant["regression"]["flagged"] is True and variant["regression"]["slowdown"] == pytest.approx(1.5)
    assert variant["regression"]["baseline_job"] == measured_job["job"]
    assert "bench-box onnxruntime: 1.32.0 → 1.33.0" in report["rerun"]["differences"]
    assert report["rerun"]["latency"][0]["ratio"] == pytest.approx(1.5)
    assert JobEvent.objects.filter(job_id=rerun.json()["id"], level="warning", message__startswith="Regression:").exists()
    flagged = tenant.client.get("/api/v1/performance/", {"regression": "true"}).json()
    assert flagged["count"] == 1 and flagged["results"][0]["job"] == rerun.json()["id"]


def test_a_rerun_within_the_noise_is_not_flagged(tenant, measured_job, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        rerun = tenant.client.post(f"/api/v1/jobs/{measured_job['job']}/rerun/").json()
    # 3% slower with a spread of 0.05 ms: inside the interval of both runs (workers/noise.py).
    measure(measured_job["agent"], django_capture_on_commit_callbacks, p50=1.03, std=0.05)
    row = Measurement.objects.get(job_id=rerun["id"])
    assert row.baseline is not None and row.regression is False


def test_a_new_model_gets_an_estimate_per_device_and_the_report_shows_its_error(tenant, measured_job, tmp_path, django_capture_on_commit_callbacks):
    other = tmp_path / "transformer.onnx"
    onnx.save(build_transformer_like(), other)
    version = upload(tenant.client, "/api/v1/models/", other, name="transformer").json()["versions"][0]["id"]
    estimate = tenant.client.get("/api/v1/performance/estimate/", {"model_version": version}).json()
    [device] = estimate["devices"]
    assert device["agent"]["name"] == "bench-box" and device["backend"] == "onnxruntime" and device["p50_ms"] > 0
    assert device["models"] == 1 and 0 <= device["coverage"] <= 1
    # One other model measured: nothing to check the fit against, so the range is the prior factor either way.
    from kiln.reports.estimate import PRIOR_FACTOR

    assert device["factor"] == PRIOR_FACTOR and device["low_ms"] == pytest.approx(device["p50_ms"] / PRIOR_FACTOR)
    assert device["high_ms"] == pytest.approx(device["p50_ms"] * PRIOR_FACTOR)
    # Measuring it: the report compares the estimate with the measured p50.
    with django_capture_on_commit_callbacks(execute=True):
        job = tenant.client.post("/api/v1/jobs/", {"model_version": version, "precisions": ["fp32"]}, format="json").json()
    measure(measured_job["agent"], django_capture_on_commit_callbacks, p50=2.0, std=0.01)
    shown = tenant.client.get(f"/api/v1/jobs/{job['id']}/report/").json()["devices"][0]["estimate"]
    assert shown["estimated_p50_ms"] == pytest.approx(device["p50_ms"])
    assert shown["measured_p50_ms"] == 2.0 and shown["error"] == pytest.approx((device["p50_ms"] - 2.0) / 2.0)
