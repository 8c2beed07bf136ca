"""Every process that parses a user's model or data runs in the OS sandbox, and running unconfined is for development only.

Issue 34: the convert and quantize stages parsed the same untrusted file as the support check in an unconfined root
process. Here a real job runs every host stage and each parse is seen to run confined (an unprivileged user, no
network, its own file tree); a build whose toolchain writes beside the user's model writes nothing there; a model whose
external data names a host file gets nothing of that file into its variant through OpenVINO's reader (which, unlike
ONNX's and ONNX Runtime's, follows an absolute external-data path); and the server refuses to start with
KILN_SANDBOX_ALLOW_UNCONFINED=true outside tests and development.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.conftest import upload
from workers.sandbox import runner
from workers.sandbox.runner import probe

pytestmark = pytest.mark.timeout(600)
HAS_OPENVINO = importlib.util.find_spec("openvino") is not None


@pytest.fixture(scope="module")
def granted():
    sandbox = probe()["sandbox"]
    if not (sandbox["mount_namespace"] and sandbox["user"]):
        pytest.skip(f"this kernel grants no private file tree or unprivileged user to the sandbox: {sandbox['notes']}")
    return sandbox


@pytest.fixture
def confined_runs(monkeypatch):
    """Every sandboxed command the code under test runs, with what the kernel granted it (read where the runner reads it)."""
    seen: list[tuple[str, dict]] = []
    real = runner._read_result

    def spy(private, returncode, output, **kwargs):
        result = real(private, returncode, output, **kwargs)
        seen.append((json.loads((private / "request.json").read_text())["command"], result.get("sandbox") or {}))
        return result

    monkeypatch.setattr(runner, "_read_result", spy)
    return seen


@pytest.mark.django_db
def test_every_stage_that_reads_a_users_model_or_data_runs_confined(tenant, model_files, granted, confined_runs, settings, tmp_path,
                                                                    django_capture_on_commit_callbacks):
    settings.BLOB_ROOT = tmp_path / "blobs"
    settings.CELERY_TASK_ALWAYS_EAGER = True
    version = upload(tenant.client, "/api/v1/models/", model_files["model"], name="digits").json()["versions"][0]["id"]
    calibration = upload(tenant.client, "/api/v1/datasets/", model_files["calibration"], kind="calibration").json()["id"]
    validation = upload(tenant.client, "/api/v1/datasets/", model_files["validation"], kind="validation").json()["id"]
    with django_capture_on_commit_callbacks(execute=True):
        job = tenant.client.post("/api/v1/jobs/", {"model_version": version, "precisions": ["fp32", "int8"], "calibration_dataset": calibration,
                                                   "validation_dataset": validation}, format="json")
    assert job.status_code == 201, job.content
    assert tenant.client.get(f"/api/v1/jobs/{job.json()['id']}/").json()["status"] == "waiting_for_devices"
    commands = {command for command, _ in confined_runs}
    # The upload's parse, then validate, convert, support, reference, and each variant's build.
    assert {"onnx.inspect", "dataset.inspect", "onnx.validate", "onnx.convert", "support.check", "reference.compute", "quantize.build"} <= commands
    user = "uid 65534" if os.geteuid() == 0 else granted["user"]
    for command, sandbox in confined_runs:
        assert sandbox["user"] == user and sandbox["network_namespace"] and sandbox["mount_namespace"], (command, sandbox)


def test_a_build_writes_nothing_beside_the_users_model(model_files, granted, tmp_path):
    """ONNX Runtime's dynamic quantizer writes `<model>-inferred` beside the model it reads: on a server, into the blob store."""
    from workers.quantize.isolated import build_isolated

    folder = tmp_path / "blobs"
    folder.mkdir()
    model = folder / "4a" / "model-blob"
    model.parent.mkdir()
    model.write_bytes(Path(model_files["model"]).read_bytes())
    before = {path: path.stat().st_mtime_ns for path in [folder, model.parent]}
    time.sleep(0.05)
    built = build_isolated(model_path=model, precision="int8-dynamic", out_path=tmp_path / "out" / "int8-dynamic.onnx")
    assert built["sandbox"]["mount_namespace"] and (tmp_path / "out" / "int8-dynamic.onnx").exists()
    # Not even a file made and removed again: the folders' modification times are what they were.
    assert {path: path.stat().st_mtime_ns for path in before} == before
    assert sorted(p.name for p in model.parent.iterdir()) == ["model-blob"]


def _model_with_external_data_at(location: str, path: Path) -> Path:
    weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4], data_location=TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        weight.external_data.add(key=key, value=value)
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "leak", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed")
def test_a_model_naming_a_host_file_as_its_weights_gets_nothing_of_it_into_its_variant(granted, tmp_path):
    """OpenVINO's ONNX reader follows an absolute external-data path; in the sandbox that file is not in its file tree."""
    import openvino as ov

    from workers.quantize.isolated import build_isolated

    secret_folder = tmp_path / "server-secrets"
    secret_folder.mkdir(mode=0o700)
    secret = secret_folder / "key.bin"
    stolen = np.array([1.5, 2.25, -3.0, 4.0], np.float32)  # exact in fp16 too, whatever the IR stores
    secret.write_bytes(stolen.tobytes())
    model = _model_with_external_data_at(str(secret), tmp_path / "leak.onnx")
    calibration = tmp_path / "calibration.npz"
    np.savez(calibration, x=np.zeros((8, 4), np.float32))
    out = tmp_path / "variant.openvino.tar"
    try:
        build_isolated(model_path=model, precision="int8", out_path=out, calibration_path=calibration, options={"runtime": "openvino"})
    except Exception as error:  # in the sandbox the reader finds no such file: the build fails, and says none of its values
        assert "2.25" not in str(error), error
    if out.exists():
        import tarfile

        with tarfile.open(out) as archive:
            xml, weights = (archive.extractfile(name).read() for name in ("model.xml", "model.bin"))
        compiled = ov.Core().compile_model(ov.Core().read_model(xml, ov.Tensor(np.frombuffer(weights, np.uint8))), "CPU")
        leaked = compiled(np.zeros((1, 4), np.float32))[0][0]
        assert not np.allclose(leaked, stolen), "the host file's bytes reached the variant"


def _settings_start(**env) -> subprocess.CompletedProcess:
    """A fresh process loading Kiln's settings (no test runner in it), as a server start does."""
    code = "import django; django.setup(); from django.conf import settings; print(settings.SANDBOX_ALLOW_UNCONFINED)"
    clean = {key: value for key, value in os.environ.items() if not key.startswith("KILN_SANDBOX") and key != "KILN_DEBUG"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**clean, "DJANGO_SETTINGS_MODULE": "kiln.settings", **env})


def test_running_unconfined_is_refused_outside_tests_and_development():
    refused = _settings_start(KILN_SANDBOX_ALLOW_UNCONFINED="true")
    assert refused.returncode != 0 and "ImproperlyConfigured" in refused.stderr, refused.stderr[-2000:]
    assert "KILN_SANDBOX_ALLOW_UNCONFINED=true is for tests and development (KILN_DEBUG=true) only" in refused.stderr
    development = _settings_start(KILN_SANDBOX_ALLOW_UNCONFINED="true", KILN_DEBUG="true")
    assert development.returncode == 0 and development.stdout.strip() == "True", development.stderr[-2000:]
    assert _settings_start().stdout.strip() == "False"
    assert "KILN_SANDBOX_UID" in _settings_start(KILN_SANDBOX_UID="0").stderr


def test_the_start_up_line_says_which_confinement_is_in_force(granted):
    from kiln.core.management.commands.up import sandbox_summary

    line = sandbox_summary()
    assert "every escape attempt stopped" in line and "unprivileged user" in line
    assert "every parser of a user's file runs confined" in line and "quantize and build" in line
