"""The deployments list: the same rows as each job's detail shows, in a fixed number of queries however many jobs and reports."""
from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import onnx
import pytest
from onnx import TensorProto, helper

from kiln.fleet.models import Agent
from kiln.pipeline.models import DeploymentJob, JobStatus
from kiln.registry.services import model_create
from kiln.reports.models import Report

pytestmark = pytest.mark.django_db


def tiny_model(tenant, tmp_path: Path, name: str):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    upload = SimpleNamespace(name=path.name, temporary_file_path=lambda: str(path), sha256=hashlib.sha256(path.read_bytes()).hexdigest())
    return model_create(organization=tenant.organization, user=tenant.user, name=name, upload=upload)


def verdict(label: str, ratio: float) -> dict:
    return {"recommendation": {"decision": {"label": label, "speedup": {"ratio": ratio, "comparison": "faster"}, "text": f"Use {label}",
                                            "comparison": "faster", "short": f"{ratio:.2f}x faster", "tie": False,
                                            "accuracy": {"metric": "cosine", "value": 0.999}, "alternatives": [{"why": "x" * 100}] * 20}},
            "variants": [{"id": n, "latency_ms": {"p50": 1.0}} for n in range(20)]}


@pytest.fixture
def jobs(tenant, tmp_path):
    """Six finished jobs of two models, each with a report from a named agent and one from a target without one."""
    agents = [Agent.objects.create(organization=tenant.organization, name=f"box-{n}", lookup_prefix=f"p{n}", digest=f"{n:064d}") for n in range(2)]
    created = []
    for number in range(6):
        model = tiny_model(tenant, tmp_path, f"model-{number % 2}") if number < 2 else created[number % 2].model_version.model
        precisions = ["auto"] if number == 0 else ["fp32", "int8-dynamic"]
        job = DeploymentJob.objects.create(organization=tenant.organization, created_by=tenant.user, model_version=model.versions.first(),
                                           precisions=precisions, status=JobStatus.SUCCEEDED, stage="report", targets=["onnxruntime"],
                                           search={"budget_minutes": 5, "started_at": 1.0, "stopped": "budget"} if number == 0 else {},
                                           evaluation={"plan": list(range(50))}, stages=[{"name": "validate", "status": "done", "started_at": None, "finished_at": None, "message": ""}])
        Report.objects.create(organization=tenant.organization, job=job, target="onnxruntime", agent=agents[number % 2], data=verdict("int8", 2.0))
        Report.objects.create(organization=tenant.organization, job=job, target="tensorrt", reason="no device measured it", data={"variants": []})
        created.append(job)
    return created


def test_each_listed_job_is_its_detail_without_the_detail_fields(tenant, jobs):
    listed = tenant.client.get("/api/v1/jobs/").json()["results"]
    assert [job["id"] for job in listed] == [job.id for job in reversed(jobs)]
    for row in listed:
        detail = tenant.client.get(f"/api/v1/jobs/{row['id']}/").json()
        assert row == {key: detail[key] for key in row}
    first = listed[-1]
    assert first["budget"] == {"minutes": 5, "started_at": 1.0, "work_seconds": 0.0, "seconds_left": None, "first_answer_at": None,
                               "stopped": "budget"}
    assert first["model"]["name"] == "model-0" and first["model"]["version"] == 1
    # `precision` (what the pick runs in) and `provisional` joined the outcome with issue 33.
    assert first["outcome"] == [
        {"device": "box-0", "agent": jobs[0].reports.get(target="onnxruntime").agent_id, "recommended": "int8", "precision": None,
         "speedup": 2.0, "comparison": "faster", "provisional": False, "speedup_text": "2.00x faster", "beyond_noise": True, "tie": False,
         "accuracy": {"metric": "cosine", "value": 0.999}, "verdict": "Use int8"},
        {"device": "tensorrt", "agent": None, "recommended": None, "precision": None, "speedup": None, "comparison": None,
         "provisional": False, "speedup_text": None, "beyond_noise": None, "tie": False, "accuracy": None, "verdict": "no device measured it"},
    ]


def test_a_page_of_jobs_is_three_queries_with_a_cached_token(tenant, jobs, settings, django_assert_max_num_queries):
    """The count, the jobs with their model names, their reports with agent names: not one more per job or report."""
    settings.API_TOKEN_AUTH_CACHE_SECONDS = 3600
    assert tenant.client.get("/api/v1/jobs/").status_code == 200  # the token is looked up and remembered
    with django_assert_max_num_queries(3):
        response = tenant.client.get("/api/v1/jobs/")
    assert len(response.json()["results"]) == 6
    model = jobs[1].model_version.model_id
    with django_assert_max_num_queries(3):
        filtered = tenant.client.get(f"/api/v1/jobs/?model={model}").json()["results"]
    assert {job["model"]["id"] for job in filtered} == {model} and len(filtered) == 3
