"""A learned variant the search proposes is built by the pipeline like any other: its artifact, its recipe
with the learning curve and time (what the report shows), and the reason when it cannot be learned."""
from __future__ import annotations

import onnx
import pytest

from kiln.pipeline.models import Variant
from kiln.pipeline.quantize import variant_build
from tests.conftest import upload
from tests.fixtures.models import write_npz
from tests.fixtures.rounding import build_rounding_sensitive_mlp, rounding_inputs

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def private_storage(settings, tmp_path):
    settings.BLOB_ROOT = tmp_path / "blobs"
    settings.CELERY_TASK_ALWAYS_EAGER = True


def test_the_pipeline_builds_a_learned_variant_and_keeps_its_curve(tenant, tmp_path, django_capture_on_commit_callbacks):
    model_path = tmp_path / "rounding.onnx"
    onnx.save(build_rounding_sensitive_mlp(), model_path)
    calibration = write_npz(tmp_path / "calibration.npz", input=rounding_inputs(samples=64, seed=1))
    version = upload(tenant.client, "/api/v1/models/", model_path, name="rounding").json()["versions"][0]["id"]
    calibration_id = upload(tenant.client, "/api/v1/datasets/", calibration, kind="calibration").json()["id"]
    with django_capture_on_commit_callbacks(execute=True):
        job_id = tenant.client.post("/api/v1/jobs/", {"model_version": version, "precisions": ["int8"], "calibration_dataset": calibration_id},
                                    format="json").json()["id"]
    calibrated = Variant.objects.get(job_id=job_id, key="int8")
    learned = Variant.objects.create(organization=calibrated.organization, job_id=job_id, key="int8-adaround", precision="int8", round=2,
                                     options={**calibrated.options, "learn": "adaround", "learn_seconds": 3})
    variant_build(variant_id=learned.id)
    learned.refresh_from_db()
    assert learned.status == "ready", learned.error
    assert learned.recipe["learned"]["method"] == "adaround" and learned.recipe["learned"]["curve"]
    assert learned.cache_key != calibrated.cache_key and learned.artifact.blob_id != calibrated.artifact.blob_id
    job = tenant.client.get(f"/api/v1/jobs/{job_id}/").json()
    assert any("Built int8-adaround" in event["message"] for event in job["events"])
