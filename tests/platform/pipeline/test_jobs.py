"""Jobs: requests are checked up front; the host stages run through Celery tasks and record why."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from devices.artifacts import OPENVINO_IR, artifact_format
from kiln.pipeline.models import Artifact, DeploymentJob, DeviceTask, JobStatus, Variant
from kiln.registry.selectors import blob_file
from tests.conftest import upload
from tests.fixtures.models import write_npz

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def private_storage(settings, tmp_path):
    settings.BLOB_ROOT = tmp_path / "blobs"
    settings.CELERY_TASK_ALWAYS_EAGER = True


@pytest.fixture
def uploaded(tenant, model_files):
    model = upload(tenant.client, "/api/v1/models/", model_files["model"], name="digits").json()
    calibration = upload(tenant.client, "/api/v1/datasets/", model_files["calibration"], kind="calibration").json()
    validation = upload(tenant.client, "/api/v1/datasets/", model_files["validation"], kind="validation").json()
    return {"version": model["versions"][0]["id"], "calibration": calibration["id"], "validation": validation["id"]}


def create_job(tenant, **body):
    return tenant.client.post("/api/v1/jobs/", body, format="json")


@pytest.mark.parametrize(
    "override, code",
    [
        ({"precisions": ["int3"]}, "invalid_precisions"),
        ({"precisions": ["auto", "fp32"]}, "invalid_precisions"),
        ({"tolerance": {"metric": "vibes"}}, "invalid_tolerance"),
        ({"tolerance": {"metric": "cosine", "max_drop": "a lot"}}, "invalid_tolerance"),
        ({"tolerance": {"metric": "cosine", "max_drop": 5}}, "invalid_tolerance"),
        ({"targets": [{"gpu": True}]}, "invalid_targets"),
        ({"targets": [999999]}, "invalid_targets"),
        ({"budget_minutes": 0}, "invalid_budget"),
        ({"budget_minutes": "soon"}, "invalid_budget"),
        ({"budget_minutes": 100000}, "invalid_budget"),
    ],
)
def test_bad_job_requests_are_400_with_a_reason(tenant, uploaded, override, code):
    response = create_job(tenant, model_version=uploaded["version"], **override)
    assert response.status_code == 400, response.content
    assert response.json()["code"] == code
    assert DeploymentJob.objects.count() == 0


def test_static_int8_needs_calibration(tenant, uploaded):
    response = create_job(tenant, model_version=uploaded["version"], precisions=["int8"])
    assert response.status_code == 400
    assert "calibration" in response.json()["error"]


def test_dataset_that_does_not_match_the_model_is_refused(tenant, uploaded, tmp_path):
    wrong = write_npz(tmp_path / "wrong.npz", pixels=np.zeros((8, 64), dtype=np.float32))
    dataset = upload(tenant.client, "/api/v1/datasets/", wrong, kind="calibration").json()
    response = create_job(tenant, model_version=uploaded["version"], precisions=["int8"], calibration_dataset=dataset["id"])
    assert response.status_code == 400
    assert response.json()["code"] == "dataset_mismatch"
    assert "input" in response.json()["error"]


def test_host_stages_build_every_variant_then_wait_for_devices(tenant, uploaded, model_files, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = create_job(
            tenant,
            model_version=uploaded["version"],
            precisions=["fp32", "int8", "int8-dynamic", "int4-weight"],
            calibration_dataset=uploaded["calibration"],
            validation_dataset=uploaded["validation"],
        )
    assert response.status_code == 201, response.content
    job = tenant.client.get(f"/api/v1/jobs/{response.json()['id']}/").json()
    assert job["status"] == "waiting_for_devices", job["events"]
    assert [s["status"] for s in job["stages"][:4]] == ["done"] * 4
    variants = {v["key"]: v for v in job["variants"]}
    assert variants["fp32"]["status"] == "ready" and variants["int8"]["status"] == "ready"
    assert variants["int4-weight"]["status"] in ("ready", "skipped")
    if variants["int4-weight"]["status"] == "skipped":
        assert variants["int4-weight"]["error"]
    assert any("Waiting for devices" in e["message"] for e in job["events"])
    artifacts = tenant.client.get(f"/api/v1/jobs/{job['id']}/artifacts/").json()
    kinds = {a["kind"] for a in artifacts}
    assert {"converted", "reference", "variant"} <= kinds
    int8 = Artifact.objects.get(job_id=job["id"], name="int8.onnx")
    session = ort.InferenceSession(str(blob_file(int8.blob)), providers=["CPUExecutionProvider"])
    ops = {node.op_type for node in __import__("onnx").load(str(blob_file(int8.blob))).graph.node}
    assert "QuantizeLinear" in ops
    x = np.load(model_files["validation"])["input"][:64]
    fp32 = ort.InferenceSession(str(model_files["model"]), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    quantized = session.run(None, {"input": x})[0]
    assert (fp32.argmax(1) == quantized.argmax(1)).mean() >= 0.95
    # INT8 is built for each runtime: the QDQ file for ONNX Runtime, NNCF's IR on OpenVINO's own model for OpenVINO.
    assert Variant.objects.get(job_id=job["id"], key="int8").backends == ["onnxruntime"]
    ov_int8 = Variant.objects.get(job_id=job["id"], key="ov-int8")
    assert (ov_int8.status, ov_int8.precision, ov_int8.backends) == ("ready", "int8", ["openvino"])
    assert ov_int8.artifact.name == "ov-int8.openvino.tar"
    assert artifact_format(blob_file(ov_int8.artifact.blob)) == OPENVINO_IR


def test_conversion_steps_are_recorded_and_a_skipped_one_is_not_fatal(tenant, uploaded, django_capture_on_commit_callbacks):
    """Conversion runs in the sandbox; its report (a failing step is skipped with the reason: tests/workers/test_convert.py)
    reaches the job's events, a skipped step as a warning, and the job goes on."""
    with django_capture_on_commit_callbacks(execute=True):
        job_id = create_job(tenant, model_version=uploaded["version"], precisions=["fp32"]).json()["id"]
    job = tenant.client.get(f"/api/v1/jobs/{job_id}/").json()
    assert job["status"] == "waiting_for_devices"
    events = [(e["level"], e["message"]) for e in job["events"] if e["stage"] == "convert"]
    assert ("warning", "opset_upgrade skipped: already at opset 17 (>= 13)") in events, events
    assert ("info", "simplify applied") in events, events


def test_invalid_model_on_disk_fails_validate_with_the_reason(tenant, uploaded, django_capture_on_commit_callbacks):
    from kiln.registry.models import ModelVersion
    from kiln.registry.selectors import model_version_onnx_path

    version = ModelVersion.objects.get(pk=uploaded["version"])
    path = model_version_onnx_path(version)
    original = path.read_bytes()
    try:
        path.write_bytes(b"garbage")
        with django_capture_on_commit_callbacks(execute=True):
            job_id = create_job(tenant, model_version=uploaded["version"], precisions=["fp32"]).json()["id"]
    finally:
        path.write_bytes(original)
    job = tenant.client.get(f"/api/v1/jobs/{job_id}/").json()
    assert job["status"] == "failed"
    assert job["error"].startswith("validate:")


def test_cancel_stops_queued_work(tenant, uploaded):
    job_id = create_job(tenant, model_version=uploaded["version"], precisions=["fp32"]).json()["id"]
    response = tenant.client.post(f"/api/v1/jobs/{job_id}/cancel/")
    assert response.status_code == 200
    assert response.json()["status"] == "canceled"
    again = tenant.client.post(f"/api/v1/jobs/{job_id}/cancel/")
    assert again.status_code == 409
    from workers.tasks import job_validate

    job_validate.apply(args=[job_id])
    job = DeploymentJob.objects.get(pk=job_id)
    assert job.status == JobStatus.CANCELED
    assert not Variant.objects.filter(job=job).exists() and not DeviceTask.objects.filter(job=job).exists()


def test_stage_task_running_twice_leaves_one_result(tenant, uploaded, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        job_id = create_job(tenant, model_version=uploaded["version"], precisions=["fp32", "int8-dynamic"]).json()["id"]
    from kiln.pipeline.quantize import job_quantize, variant_build

    job_quantize(job_id=job_id)
    for variant in Variant.objects.filter(job_id=job_id):
        variant_build(variant_id=variant.id)
    assert Variant.objects.filter(job_id=job_id).count() == 2
    assert Artifact.objects.filter(job_id=job_id, kind="variant").count() == 2


def test_auto_without_calibration_skips_static_int8(tenant, uploaded, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        job_id = create_job(tenant, model_version=uploaded["version"]).json()["id"]
    keys = set(Variant.objects.filter(job_id=job_id).values_list("key", flat=True))
    assert "fp32" in keys and "int8-dynamic" in keys and "int8" not in keys


def test_identical_build_is_reused_from_the_cache_not_rebuilt(tenant, uploaded, monkeypatch, django_capture_on_commit_callbacks):
    body = {"model_version": uploaded["version"], "precisions": ["int8"], "calibration_dataset": uploaded["calibration"]}
    with django_capture_on_commit_callbacks(execute=True):
        first = create_job(tenant, **body).json()["id"]
    import kiln.pipeline.quantize as quantize

    def no_rebuild(**kwargs):
        raise AssertionError("an identical variant was rebuilt")

    monkeypatch.setattr(quantize, "build_isolated", no_rebuild)
    with django_capture_on_commit_callbacks(execute=True):
        second = create_job(tenant, **body).json()["id"]
    original = Variant.objects.get(job_id=first, key="int8")
    reused = Variant.objects.get(job_id=second, key="int8")
    assert reused.status == "ready" and reused.recipe["cached_from_job"] == first
    assert reused.cache_key == original.cache_key and reused.artifact.blob_id == original.artifact.blob_id
    events = tenant.client.get(f"/api/v1/jobs/{second}/").json()["events"]
    assert any("reused the identical build" in e["message"] for e in events)


def test_a_different_calibration_set_is_a_different_build(tenant, uploaded, model_files, django_capture_on_commit_callbacks):
    other = upload(tenant.client, "/api/v1/datasets/", model_files["validation"], kind="calibration").json()["id"]
    with django_capture_on_commit_callbacks(execute=True):
        first = create_job(tenant, model_version=uploaded["version"], precisions=["int8"], calibration_dataset=uploaded["calibration"]).json()["id"]
        second = create_job(tenant, model_version=uploaded["version"], precisions=["int8"], calibration_dataset=other).json()["id"]
    for key in ("int8", "ov-int8"):
        assert Variant.objects.get(job_id=first, key=key).cache_key != Variant.objects.get(job_id=second, key=key).cache_key
        assert "cached_from_job" not in Variant.objects.get(job_id=second, key=key).recipe


def test_a_stray_stage_message_for_a_job_elsewhere_in_its_pipeline_changes_nothing(tenant, uploaded):
    job_id = create_job(tenant, model_version=uploaded["version"], precisions=["fp32"]).json()["id"]
    from workers.tasks import job_quantize, job_report

    job_report.apply(args=[job_id])
    job_quantize.apply(args=[job_id])
    job = DeploymentJob.objects.get(pk=job_id)
    assert job.status == JobStatus.QUEUED and job.stage == "validate"
    assert not Variant.objects.filter(job=job).exists()


@pytest.mark.parametrize(
    "metrics, code, fragment",
    [
        ([{"output": "probabilities", "kind": "accuracy"}], "unknown_output", "no output 'probabilities'"),
        ([{"output": "logits", "kind": "mask_iou", "threshold": 1.2}], "invalid_metrics", "threshold"),
        ([{"output": "logits", "kind": "mask_iou", "threshold": "1e999"}], "invalid_metrics", "finite"),
        ([{"output": "logits", "kind": "ctc"}], "invalid_metrics", "blank"),
        ([{"output": "logits", "kind": "ctc", "blank": 0}], "labels_mismatch", "fit no CTC metric"),
        ([{"output": "logits", "kind": "mean_iou"}], "labels_mismatch", "fit no mask metric"),
        ({"output": "logits"}, "invalid_metrics", "must be a list"),
    ],
)
def test_bad_declared_metrics_are_400_with_a_reason(tenant, uploaded, metrics, code, fragment):
    response = create_job(tenant, model_version=uploaded["version"], validation_dataset=uploaded["validation"], metrics=metrics)
    assert response.status_code == 400, response.content
    assert response.json()["code"] == code and fragment in response.json()["error"]
    assert DeploymentJob.objects.count() == 0


def test_label_metrics_need_labels(tenant, uploaded):
    response = create_job(tenant, model_version=uploaded["version"], calibration_dataset=uploaded["calibration"],
                          metrics=[{"output": "logits", "kind": "accuracy", "primary": True}])
    assert response.status_code == 400 and response.json()["code"] == "labels_required"


def test_the_evaluation_plan_follows_the_model_and_the_declared_metrics(tenant, uploaded, django_capture_on_commit_callbacks):
    version = DeploymentJob._meta.get_field("model_version").related_model.objects.get(pk=uploaded["version"])
    version.output_kind_overrides = {"logits": "embedding"}
    version.save()
    with django_capture_on_commit_callbacks(execute=True):
        response = create_job(tenant, model_version=uploaded["version"], precisions=["fp32"], validation_dataset=uploaded["validation"],
                              metrics=[{"output": "logits", "kind": "accuracy", "primary": True}])
    assert response.status_code == 201, response.content
    job = tenant.client.get(f"/api/v1/jobs/{response.json()['id']}/").json()
    assert job["metrics"] == [{"output": "logits", "kind": "accuracy", "primary": True}]
    [entry] = job["evaluation"]["outputs"]
    assert entry["name"] == "logits" and entry["kind"] == "embedding" and entry["primary"] and entry["reason"] == "set by the user"
    assert any("Outputs judged as logits: embedding (primary)" in e["message"] for e in job["events"])
    task = DeviceTask.objects.filter(job_id=job["id"]).first()
    if task is not None:
        from kiln.fleet.api.agent_views import task_payload

        assert task_payload(task)["evaluation"] == job["evaluation"]


def test_the_validation_sets_recipe_names_an_outputs_kind_and_the_users_override_still_wins(tenant, uploaded,
                                                                                          django_capture_on_commit_callbacks):
    from kiln.registry.models import Dataset

    Dataset.objects.filter(pk=uploaded["validation"]).update(
        recipe={"type": "image", "outputs": {"logits": {"kind": "distribution", "window": 2}}})
    with django_capture_on_commit_callbacks(execute=True):
        response = create_job(tenant, model_version=uploaded["version"], precisions=["fp32"], validation_dataset=uploaded["validation"])
    assert response.status_code == 201, response.content
    [entry] = tenant.client.get(f"/api/v1/jobs/{response.json()['id']}/").json()["evaluation"]["outputs"]
    assert entry["kind"] == "distribution" and entry["options"] == {"window": 2}
    assert entry["reason"] == "named by the validation set's recipe (kind distribution, window 2)"

    version = DeploymentJob._meta.get_field("model_version").related_model.objects.get(pk=uploaded["version"])
    version.output_kind_overrides = {"logits": "class_scores"}
    version.save()
    with django_capture_on_commit_callbacks(execute=True):
        response = create_job(tenant, model_version=uploaded["version"], precisions=["fp32"], validation_dataset=uploaded["validation"])
    [entry] = tenant.client.get(f"/api/v1/jobs/{response.json()['id']}/").json()["evaluation"]["outputs"]
    assert entry["kind"] == "class_scores" and entry["reason"] == "set by the user"


def test_a_recipe_names_output_kinds_it_knows_with_bounded_options():
    from kiln_contract.recipes import RecipeError, parse_recipe

    recipe = parse_recipe({"type": "image", "size": [32, 32], "outputs": {"maps": {"kind": "heat_map", "threshold": 0.3}}})
    assert recipe["outputs"] == {"maps": {"kind": "heat_map", "threshold": 0.3}}
    for bad, fragment in (({"maps": {"kind": "mask"}}, "kind must be one of"), ({"maps": {"kind": "heat_map", "threshold": 3}}, "threshold"),
                          ({"maps": {"kind": "heat_map", "colour": 1}}, "takes no colour"), (["maps"], "outputs must be an object")):
        with pytest.raises(RecipeError, match=fragment):
            parse_recipe({"type": "image", "size": [32, 32], "outputs": bad})


def test_the_search_budget_is_shown_and_a_spent_budget_stops_the_search_with_the_reason(tenant, uploaded):
    import time

    import kiln.pipeline.quantize as quantize

    default = create_job(tenant, model_version=uploaded["version"], precisions=["auto"]).json()
    assert default["budget"]["minutes"] == 10  # the default: a whole search, learning included, in 10 minutes (issue 24)
    assert create_job(tenant, model_version=uploaded["version"], precisions=["fp32"]).json()["budget"] == {}
    job_id = create_job(tenant, model_version=uploaded["version"], precisions=["auto"], budget_minutes=2).json()["id"]
    job = DeploymentJob.objects.get(pk=job_id)
    # The budget counts the job's own work (issue 33), not the hour it spent waiting behind other jobs.
    job.search["started_at"] = time.time() - 3600
    job.save()
    DeploymentJob.objects.filter(pk=job_id).update(work_seconds=30)
    job.refresh_from_db()
    budget = tenant.client.get(f"/api/v1/jobs/{job_id}/").json()["budget"]
    assert budget["minutes"] == 2 and budget["seconds_left"] == 90 and budget["work_seconds"] == 30
    assert not quantize._budget_spent(job)

    DeploymentJob.objects.filter(pk=job_id).update(work_seconds=121)
    job.refresh_from_db()
    assert quantize._next_round_specs(job) == []
    job.refresh_from_db()
    assert job.search["stopped"].startswith("the time budget of 2 minute(s) was spent after round 1")
    detail = tenant.client.get(f"/api/v1/jobs/{job_id}/").json()
    assert detail["budget"]["seconds_left"] == 0 and detail["budget"]["stopped"] == job.search["stopped"]
    assert any("The search stopped: the time budget of 2 minute(s)" in e["message"] for e in detail["events"])


def test_a_round_keeps_what_its_time_left_pays_for_and_the_events_name_what_was_left_out(tenant, uploaded):

    import kiln.pipeline.quantize as quantize

    job = DeploymentJob.objects.get(pk=create_job(tenant, model_version=uploaded["version"], precisions=["auto"], budget_minutes=2).json()["id"])
    DeploymentJob.objects.filter(pk=job.pk).update(work_seconds=90)  # 30 s left; 10 measurements in 90 s of work: about 9 s each
    job.refresh_from_db()
    plain = [{"key": key, "precision": "int8", "options": {}, "backends": ["onnxruntime"], "compile": {}} for key in ("int8-mse", "int8-entropy")]
    learned = {"key": "int8-mse-adaround", "precision": "int8", "options": {"learn": "adaround", "learn_seconds": 60},
               "backends": ["onnxruntime"], "compile": {}}
    kept = quantize._fit_to_budget(job, [learned, *plain], 2, measurements=10)
    assert [spec["key"] for spec in kept] == ["int8-mse", "int8-entropy"]
    messages = [event.message for event in job.events.all()]
    assert any(message.startswith("The search's round 2: 1 candidate(s) left out for the time budget") and message.endswith("int8-mse-adaround.")
               for message in messages), messages
    assert "stopped" not in job.search

    # Nothing fits: the search stops, and says why.
    assert quantize._fit_to_budget(job, plain, 3, measurements=1) == []
    job.refresh_from_db()
    assert job.search["stopped"] == "what is left of the time budget would not cover round 3's candidates; the report shows the best found"


def test_the_rounds_leave_the_finalists_re_timing_its_share_of_the_budget(tenant, uploaded):
    import kiln.pipeline.quantize as quantize
    from kiln.pipeline.retime import finalists, retime_reserve
    from workers.quantize.round_budget import retime_seconds

    job = DeploymentJob.objects.get(pk=create_job(tenant, model_version=uploaded["version"], precisions=["auto"], budget_minutes=2).json()["id"])
    DeploymentJob.objects.filter(pk=job.pk).update(work_seconds=90)  # 30 s left, about 9 s a measurement
    job.refresh_from_db()
    plain = [{"key": key, "precision": "int8", "options": {}, "backends": ["onnxruntime"], "compile": {}} for key in ("int8-mse", "int8-entropy")]
    # What two devices' finalists will take to re-time (each device its own) is set aside before the round is fitted.
    measured = [{"id": key, "key": key, "backend": "onnxruntime", "precision": precision, "compile": {}, "latency_ms": {"p50": p50},
                 "accuracy": {"within_tolerance": passes}}
                for key, precision, p50, passes in (("fp32", "fp32", 400.0, True), ("int8-minmax", "int8", 150.0, True),
                                                    ("int8-mse", "int8", 100.0, False))]
    reserve = retime_reserve({"a": measured, "b": measured[:2]})
    assert reserve == 2 * retime_seconds([400.0, 150.0]) > 10
    assert [entry["key"] for entry in finalists(measured)] == ["int8-minmax", "fp32"]
    assert retime_reserve({"a": measured[:1]}) == 0  # one finalist: nothing is re-timed, nothing set aside
    assert quantize._fit_to_budget(job, plain, 2, measurements=10, reserve_s=reserve) == []
    job.refresh_from_db()
    assert job.search["stopped"] == (f"what is left of the time budget would not cover round 2's candidates and the finalists' re-timing "
                                     f"(about {reserve:.0f} s); the report shows the best found")


def test_a_compile_option_variant_shares_its_build_and_carries_its_options_to_the_device(tenant, uploaded):
    import kiln.pipeline.quantize as quantize
    from kiln.fleet.api.agent_views import task_payload

    job = DeploymentJob.objects.get(pk=create_job(tenant, model_version=uploaded["version"], precisions=["auto"]).json()["id"])
    static = {"static_shapes": {"input": [1, 1, 8, 8]}}
    quantize._create_variants(job, [
        {"key": "fp32", "precision": "fp32", "options": {}, "backends": None, "compile": {}},
        {"key": "fp32+static", "precision": "fp32", "options": {}, "backends": ["openvino"], "compile": static},
    ], round_number=2)
    plain, tuned = Variant.objects.get(job=job, key="fp32"), Variant.objects.get(job=job, key="fp32+static")
    assert tuned.options == {"compile": static} and tuned.backends == ["openvino"]
    # The build ignores compile options: one artifact serves both variants.
    assert quantize._build_options(tuned) == {} and quantize._variant_cache_key(tuned, job) == quantize._variant_cache_key(plain, job)
    assert quantize._compile_recipe(tuned) == {"compile": static} and quantize._compile_recipe(plain) == {}
    # An unsaved task with an id is enough to render the payload an agent would lease.
    task = DeviceTask(id=1, job=job, variant=tuned, backend="openvino", target="t", organization=job.organization)
    tuned.artifact = Artifact(blob=job.model_version.blob)
    payload = task_payload(task)
    assert payload["compile"] == static


@pytest.mark.parametrize(
    "override, code, fragment",
    [
        ({"state": {"nope": "input"}}, "dataset_mismatch", "names output 'nope', which the model does not have"),
        ({"state": {"logits": "nope"}}, "dataset_mismatch", "feeds input 'nope', which the model does not have"),
        ({"state": {"logits": "input"}}, "dataset_mismatch", "state output 'logits' has shape [batch, 10] but input 'input' takes"),
        ({"state": {"nope": "input"}, "initial_state": {"other": 0}}, "dataset_mismatch", "an initial value is given for 'other'"),
        ({"state": ["stateN"]}, "invalid_state", "state must map output names"),
        ({"calibration_subset": {"count": 10**6}}, "invalid_calibration_subset", "count"),
        ({"calibration_subset": {"count": 5, "seed": -1}}, "invalid_calibration_subset", "seed"),
        ({"calibration_subset": {"count": 5, "colour": "red"}}, "invalid_calibration_subset", "calibration_subset is"),
    ],
)
def test_bad_state_mappings_and_subsets_are_400_and_store_nothing(tenant, uploaded, override, code, fragment):
    response = create_job(tenant, model_version=uploaded["version"], precisions=["int8"], calibration_dataset=uploaded["calibration"],
                          validation_dataset=uploaded["validation"], **override)
    assert response.status_code == 400, response.content
    assert response.json()["code"] == code and fragment in response.json()["error"], response.json()
    assert DeploymentJob.objects.count() == 0


def test_state_mapping_without_data_is_400(tenant, uploaded):
    response = create_job(tenant, model_version=uploaded["version"], precisions=["fp32"], state={"logits": "input"})
    assert response.status_code == 400 and response.json()["code"] == "dataset_required", response.content


def test_calibration_subset_by_count_and_seed_is_stratified_and_reported(tenant, uploaded, model_files, django_capture_on_commit_callbacks):
    labelled = upload(tenant.client, "/api/v1/datasets/", model_files["validation"], kind="calibration").json()
    with django_capture_on_commit_callbacks(execute=True):
        response = create_job(tenant, model_version=uploaded["version"], precisions=["fp32", "int8"], calibration_dataset=labelled["id"],
                              validation_dataset=uploaded["validation"], calibration_subset={"count": 40, "seed": 3})
    assert response.status_code == 201, response.content
    job = DeploymentJob.objects.get(pk=response.json()["id"])
    used = job.feeds["calibration_used"]
    assert used["samples"] == used["calls"] == 40 and used["seed"] == 3 and used["stratified"]
    labels = np.load(model_files["validation"])["labels"]
    shares = np.bincount(labels, minlength=10) * 40 / len(labels)
    assert all(abs(used["by_label"].get(str(label), 0) - share) < 1 for label, share in enumerate(shares))
    assert [labels[i] for i in used["indices"]].count(0) == used["by_label"].get("0", 0)
    assert Variant.objects.get(job=job, key="int8").recipe["samples"] == 40
    report = tenant.client.get(f"/api/v1/jobs/{job.id}/report/").json()
    assert report["datasets"]["calibration_used"]["by_label"] == used["by_label"]


def test_a_spent_budget_builds_nothing_more_but_what_is_built_is_measured(tenant, uploaded):
    import kiln.pipeline.quantize as quantize
    from kiln.pipeline.models import Variant, VariantStatus

    job = DeploymentJob.objects.get(pk=create_job(tenant, model_version=uploaded["version"], precisions=["auto"], budget_minutes=1).json()["id"])
    Variant.objects.create(job=job, organization=job.organization, key="fp32", precision="fp32", status=VariantStatus.READY)
    later = Variant.objects.create(job=job, organization=job.organization, key="int8-late", precision="int8", round=2, backends=["onnxruntime"])
    DeploymentJob.objects.filter(pk=job.pk).update(work_seconds=61, stage="quantize")
    quantize.variant_build(variant_id=later.pk)
    later.refresh_from_db()
    assert later.status == VariantStatus.SKIPPED and later.error == "not built: the search's budget was spent before its turn came"
    assert job.events.filter(message="int8-late not built: the search's budget was spent before its turn came.").exists()


def test_a_device_tasks_work_leaves_out_what_it_waited_for_quiet_windows(tenant, uploaded):
    from datetime import timedelta

    from django.utils import timezone

    from kiln.pipeline.device_tasks import device_work_seconds
    from kiln.pipeline.models import DeviceTask

    task = DeviceTask(started_at=timezone.now() - timedelta(seconds=100))
    windows = {"windows": [{"waited_s": 30.0}, {"waited_s": 20.5}]}
    assert device_work_seconds(task=task, metrics=windows) == pytest.approx(49.5, abs=1.0)
    assert device_work_seconds(task=DeviceTask(started_at=None), metrics=windows) == 0.0


def test_round_one_defers_what_would_take_the_first_answer_past_a_third_of_the_budget_and_round_two_takes_it_back(tenant, uploaded):
    import kiln.pipeline.quantize as quantize
    from kiln.registry.models import ModelVersion

    ModelVersion.objects.filter(pk=uploaded["version"]).update(parameter_count=24_000_000)
    job = DeploymentJob.objects.get(pk=create_job(tenant, model_version=uploaded["version"], precisions=["auto"], budget_minutes=10).json()["id"])
    planned = [{"key": key, "precision": precision, "options": options, "backends": backends, "compile": {}} for key, precision, options, backends in (
        ("fp32", "fp32", {}, ["onnxruntime"]), ("int8-ort-default", "int8", {}, ["onnxruntime"]),
        ("litert-fp32", "fp32", {"runtime": "litert"}, ["litert"]), ("litert-int8", "int8", {"runtime": "litert"}, ["litert"]))]
    kept = quantize._first_answer(job, planned)
    assert [spec["key"] for spec in kept] == ["fp32", "int8-ort-default"]
    assert [spec["key"] for spec in job.search["deferred"]] == ["litert-fp32", "litert-int8"]
    assert job.events.filter(message__startswith="The search's round 1 (the first answer) keeps to a third of the budget").exists()
    job.save()
    assert "litert-int8" in [spec["key"] for spec in quantize._next_round_specs(job)]
    assert "deferred" not in job.search  # they come back once


def _agent(tenant, name: str, isa: list[str]):
    from kiln.fleet.models import Agent

    return Agent.objects.create(organization=tenant.organization, name=name, lookup_prefix=name[:8], digest=name.ljust(64, "0"),
                                capabilities={"isa": isa, "runtimes": {"onnxruntime": "1.32.0", "openvino": "2026.4.1"}})


def test_bf16_by_name_is_fp32s_build_under_openvinos_bf16_hint_and_the_api_names_it_bf16(tenant, uploaded):
    import kiln.pipeline.quantize as quantize

    _agent(tenant, "sapphire", ["avx2", "avx512f", "avx512_bf16", "amx_bf16"])
    response = create_job(tenant, model_version=uploaded["version"], precisions=["fp32", "bf16"])
    assert response.status_code == 201, response.content
    job = DeploymentJob.objects.get(pk=response.json()["id"])
    quantize._plan_variants(job)
    bf16 = Variant.objects.get(job=job, key="bf16")
    assert (bf16.precision, bf16.options, bf16.backends) == ("fp32", {"compile": {"inference_precision": "bf16"}}, ["openvino"])
    # Its build is FP32's: the hint shapes the device's compile only.
    assert quantize._variant_cache_key(bf16, job) == quantize._variant_cache_key(Variant.objects.get(job=job, key="fp32"), job)
    listed = {v["key"]: v for v in tenant.client.get(f"/api/v1/jobs/{job.id}/").json()["variants"]}
    assert (listed["bf16"]["precision"], listed["bf16"]["effective_precision"]) == ("fp32", "bf16")
    assert listed["fp32"]["effective_precision"] == "fp32"


def test_bf16_by_name_on_devices_without_bf16_units_is_not_built_and_the_event_says_why(tenant, uploaded):
    import kiln.pipeline.quantize as quantize

    _agent(tenant, "old-xeon", ["avx2", "avx512f"])
    job = DeploymentJob.objects.get(pk=create_job(tenant, model_version=uploaded["version"], precisions=["fp32", "bf16"]).json()["id"])
    quantize._plan_variants(job)
    assert list(Variant.objects.filter(job=job).values_list("key", flat=True)) == ["fp32"]
    assert any(event.message.startswith("bf16 not built:") and "no bf16 units" in event.message for event in job.events.all())
