"""The report states why (issue 24): the chip → families reasons reach the job's events and the report's search notes, per target."""
from __future__ import annotations

import io
import shutil

import pytest
from rich.console import Console

from kiln.pipeline.models import DeploymentJob, Variant
from kiln_client import cli
from tests.conftest import upload

from .conftest import CAPABILITIES, measure, register

# Transactional: the agent lease long-poll reads the database from executor threads (see tests/platform/fleet).
pytestmark = pytest.mark.django_db(transaction=True)

# A Haswell-class CPU: AVX2, no VNNI, no AMX.
NO_DOT_PRODUCTS = {**CAPABILITIES, "isa": ["sse4_2", "avx", "avx2", "fma"]}


def _copy_build(*, model_path, out_path, **_):
    """Every variant built as a copy of the model: what is planned and said is under test here, not the quantizers."""
    shutil.copyfile(model_path, out_path)
    return {"recipe": {}, "backends": ["onnxruntime"], "peak_rss_mb": 1.0, "build_s": 0.0}


def test_without_dot_products_the_events_and_the_report_say_why_int8_was_pruned(tenant, model_files, django_capture_on_commit_callbacks,
                                                                                 monkeypatch):
    import kiln.pipeline.quantize as quantize

    monkeypatch.setattr(quantize, "build_isolated", _copy_build)
    agent = register(tenant, "haswell-box", NO_DOT_PRODUCTS)
    version = upload(tenant.client, "/api/v1/models/", model_files["model"], name="digits").json()["versions"][0]["id"]
    calibration = upload(tenant.client, "/api/v1/datasets/", model_files["calibration"], kind="calibration").json()["id"]
    with django_capture_on_commit_callbacks(execute=True):
        job = tenant.client.post("/api/v1/jobs/", {"model_version": version, "precisions": ["auto"], "calibration_dataset": calibration},
                                 format="json")
    assert job.status_code == 201, job.content
    job_id = job.json()["id"]
    # Round 1: the vendor INT8 defaults are measured, Kiln's own INT8 recipes are not.
    round_one = set(Variant.objects.filter(job_id=job_id, round=1).values_list("key", flat=True))
    assert {"fp32", "int8-ort-default", "int8-nncf"} <= round_one and not {"int8-minmax", "int8-dynamic"} & round_one, round_one
    target = f"agent:{DeploymentJob.objects.get(pk=job_id).organization.agents.get().id}"
    events = [event["message"] for event in tenant.client.get(f"/api/v1/jobs/{job_id}/").json()["events"]]
    pruned = next(message for message in events if message.startswith(f"{target}: INT8: pruned, no integer dot-product"))
    assert sum(message == pruned for message in events) == 1, events  # once per target
    assert f"{target}: FP16: no native FP16 arithmetic: skipped." in events

    # Measured flat (INT8 no faster than FP32): the report's search notes give the chip's reasons first, then the verdicts.
    measure(agent, django_capture_on_commit_callbacks, p50=1.0, std=0.01)
    report = tenant.client.get(f"/api/v1/jobs/{job_id}/report/").json()
    notes = report["search"]["notes"][target]
    assert notes[0].startswith("INT8: pruned, no integer dot-product") and notes[1].startswith("BF16: no bf16 units")
    assert any(note.startswith("INT8 not searched: no integer dot products, and the vendor INT8 defaults confirm it") for note in notes), notes
    assert not Variant.objects.filter(job_id=job_id, key__in=["int8-minmax", "int8-mse", "int8-entropy"]).exists()
    # `kiln report` prints them under the device's decision.
    buffer = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=buffer, width=200, color_system=None))
    cli.print_report(report)
    printed = " ".join(buffer.getvalue().split())  # as read, whatever the wrapping
    assert f"Search: {notes[0]}" in printed and notes[-1] in printed
