"""Deployment packages: a signed manifest that run.py checks; encrypted model files open only with the key."""
from __future__ import annotations

import base64
import importlib.util
import json
import subprocess
import sys
import zipfile

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.conftest import upload

from .conftest import CAPABILITIES, measure, register

# Transactional: the agent lease long-poll reads the database from executor threads (see tests/platform/fleet).
pytestmark = pytest.mark.django_db(transaction=True)

BOTH_RUNTIMES = {**CAPABILITIES, "runtimes": {"onnxruntime": "1.32.0", "openvino": "2026.4.1"}}


def package_of(client, job_id: int, directory):
    device = client.get(f"/api/v1/jobs/{job_id}/report/").json()["devices"][0]
    response = client.get(device["package"]["download_url"])
    path = directory / device["package"]["name"]
    path.write_bytes(b"".join(response.streaming_content))
    root = directory / "package"
    with zipfile.ZipFile(path) as archive:
        archive.extractall(root)
    return root


def run_package(root, *args, env=None):
    import os

    return subprocess.run([sys.executable, "run.py", *map(str, args)], cwd=root, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def deploy(tenant, model_files, capture, *, package=None, capabilities=None, precisions=("fp32",)):
    agent = register(tenant, "pkg-box", capabilities)
    version = upload(tenant.client, "/api/v1/models/", model_files["model"], name="digits").json()["versions"][0]["id"]
    with capture(execute=True):
        job = tenant.client.post("/api/v1/jobs/", {"model_version": version, "precisions": list(precisions), "package": package or {}}, format="json")
    assert job.status_code == 201, job.content
    measure(agent, capture, p50=1.0, std=0.01)
    return job.json()["id"]


def test_the_manifest_lists_every_file_and_is_signed_by_the_server(tenant, model_files, django_capture_on_commit_callbacks, tmp_path):
    job_id = deploy(tenant, model_files, django_capture_on_commit_callbacks,
                    package={"preprocessing": {"scale": 1 / 16}, "postprocessing": {"argmax": True}})
    root = package_of(tenant.client, job_id, tmp_path)
    manifest_bytes = (root / "manifest.json").read_bytes()
    manifest = json.loads(manifest_bytes)
    assert {entry["path"] for entry in manifest["files"]} == {"model.onnx", "report.json", "run.py", "kiln_feeds.py", "README.md", "signing-key.pem"}
    assert manifest["signature"]["inputs"][0]["name"] == "input" and manifest["preprocessing"] == {"scale": 1 / 16}
    assert manifest["toolchain"]["host"]["onnxruntime"] and manifest["toolchain"]["device"]["runtimes"] == {"onnxruntime": "1.32.0"}
    assert manifest["encryption"] is None and manifest["backend"] == "onnxruntime"
    served = tenant.client.get("/api/v1/packages/signing-key/").json()
    public_key = serialization.load_pem_public_key(served["public_key_pem"].encode())
    public_key.verify(base64.b64decode((root / "manifest.sig").read_bytes()), manifest_bytes)  # raises when it does not match
    pem = tmp_path / "kiln.pem"
    pem.write_text(served["public_key_pem"])
    ran = run_package(root, model_files["validation"], "--runs", "3", "--public-key", pem)
    assert ran.returncode == 0, ran.stderr
    assert "verified" in ran.stdout and "p50" in ran.stdout


@pytest.mark.parametrize("tamper", ["model", "manifest", "extra-file", "other-key"])
def test_a_tampered_package_fails_verification(tenant, model_files, django_capture_on_commit_callbacks, tmp_path, tamper):
    job_id = deploy(tenant, model_files, django_capture_on_commit_callbacks)
    root = package_of(tenant.client, job_id, tmp_path)
    args = ["--verify-only"]
    if tamper == "model":
        data = bytearray((root / "model.onnx").read_bytes())
        data[-10] ^= 0xFF
        (root / "model.onnx").write_bytes(bytes(data))
    elif tamper == "manifest":
        manifest = json.loads((root / "manifest.json").read_text())
        manifest["backend"] = "openvino"
        (root / "manifest.json").write_text(json.dumps(manifest))
    elif tamper == "extra-file":
        (root / "compiled").mkdir()
        (root / "compiled" / "evil.so").write_bytes(b"\x7fELF")
    else:
        # Re-signed by someone else: the embedded key would accept it, the pinned server key does not.
        other = Ed25519PrivateKey.generate()
        (root / "manifest.sig").write_bytes(base64.b64encode(other.sign((root / "manifest.json").read_bytes())))
        (root / "signing-key.pem").write_bytes(other.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        pem = tmp_path / "server.pem"
        pem.write_text(tenant.client.get("/api/v1/packages/signing-key/").json()["public_key_pem"])
        args += ["--public-key", pem]
    ran = run_package(root, *args)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "package verification failed" in ran.stderr


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_an_encrypted_package_runs_with_the_key_and_not_without(tenant, other_tenant, model_files, django_capture_on_commit_callbacks, tmp_path, backend):
    pytest.importorskip(backend)
    job_id = deploy(tenant, model_files, django_capture_on_commit_callbacks, package={"encrypt": True}, capabilities=BOTH_RUNTIMES)
    root = package_of(tenant.client, job_id, tmp_path)
    manifest = json.loads((root / "manifest.json").read_text())
    assert (root / "model.onnx.enc").exists() and not (root / "model.onnx").exists()
    assert manifest["encryption"]["algorithm"] == "AES-256-GCM"
    key = tenant.client.get("/api/v1/packages/key/").json()
    assert key["key_id"] == manifest["encryption"]["key_id"]
    # The ciphertext is not the model: no ONNX protobuf strings in it.
    assert b"input" not in (root / "model.onnx.enc").read_bytes()
    ran = run_package(root, model_files["validation"], "--runs", "3", "--backend", backend, env={"KILN_PACKAGE_KEY": key["key"]})
    assert ran.returncode == 0, ran.stderr
    assert f"{backend})" in ran.stdout
    without = run_package(root, model_files["validation"], "--runs", "3", "--backend", backend, env={"KILN_PACKAGE_KEY": ""})
    assert without.returncode != 0 and "encrypted" in without.stderr
    # Another organization's key does not open it.
    foreign = other_tenant.client.get("/api/v1/packages/key/").json()["key"]
    wrong = run_package(root, model_files["validation"], "--backend", backend, env={"KILN_PACKAGE_KEY": foreign})
    assert wrong.returncode != 0 and "does not open with this key" in wrong.stderr
    assert not list(root.rglob("*.onnx")), "the decrypted model must never be written to disk"


def test_the_package_file_is_named_for_the_model_version_variant_and_device(tenant, model_files, django_capture_on_commit_callbacks):
    job_id = deploy(tenant, model_files, django_capture_on_commit_callbacks)
    device = tenant.client.get(f"/api/v1/jobs/{job_id}/report/").json()["devices"][0]
    target_slug = device["target"].replace(":", "-")
    assert device["package"]["name"] == f"digits-v1-fp32-onnxruntime-pkg-box-{target_slug}.zip"
    response = tenant.client.get(device["package"]["download_url"])
    assert response["Content-Disposition"] == f'attachment; filename="{device["package"]["name"]}"'


def test_a_package_name_keeps_only_safe_characters_whatever_the_model_and_device_are_called():
    from types import SimpleNamespace

    from kiln.reports.packaging import package_name

    job = SimpleNamespace(model_version=SimpleNamespace(model=SimpleNamespace(name='../Résumé "ranker"; v2\r\n'), number=3))
    chosen = {"key": "int8-mse-keep4+static", "precision": "int8", "backend": "openvino"}
    name = package_name(job=job, target="rack=a/b", agent_name="Ünïx box\\..", chosen=chosen)
    assert name == "resume-ranker-v2-v3-int8-mse-keep4-static-openvino-unix-box-rack-a-b.zip"
    nameless = package_name(job=SimpleNamespace(model_version=SimpleNamespace(model=SimpleNamespace(name="模型"), number=1)),
                            target="agent:7", agent_name=None, chosen={"key": "fp32", "precision": "fp32", "backend": "onnxruntime"})
    assert nameless == "model-v1-fp32-onnxruntime-agent-7.zip"


LITERT_ONLY = {**CAPABILITIES, "runtimes": {"litert": "2.3.0"}}


@pytest.mark.skipif(not all(importlib.util.find_spec(name) for name in ("tensorflow", "onnx2tf", "ai_edge_litert")),
                    reason="the LiteRT converter is the `litert` extra (make install puts it in .venv)")
def test_a_litert_package_carries_the_flatbuffer_and_its_run_py_runs_it_on_litert(tenant, model_files, django_capture_on_commit_callbacks, tmp_path):
    job_id = deploy(tenant, model_files, django_capture_on_commit_callbacks, package={"encrypt": True}, capabilities=LITERT_ONLY)
    root = package_of(tenant.client, job_id, tmp_path)
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["backend"] == "litert" and manifest["variant"]["key"] == "litert-fp32" and manifest["measured"]["threads"] == 1
    assert (root / "model.tflite.enc").exists() and not list(root.glob("model.onnx*"))
    assert "`model.tflite`: the variant as a LiteRT flatbuffer" in (root / "README.md").read_text()
    key = {"KILN_PACKAGE_KEY": tenant.client.get("/api/v1/packages/key/").json()["key"]}
    ran = run_package(root, model_files["validation"], "--save-outputs", tmp_path / "outputs.npz", env=key)
    assert ran.returncode == 0, ran.stderr
    import numpy as np
    import onnxruntime as ort

    with np.load(model_files["validation"]) as data, np.load(tmp_path / "outputs.npz") as ours:
        inputs = data["input"]
        session = ort.InferenceSession(str(model_files["model"]))
        expected = np.concatenate([session.run(None, {"input": inputs[i : i + 1]})[0] for i in range(len(inputs))])
        np.testing.assert_allclose(ours[session.get_outputs()[0].name], expected, rtol=1e-4, atol=1e-4)
    other = run_package(root, model_files["validation"], "--backend", "onnxruntime", env=key)
    assert other.returncode != 0 and "runs on litert, not onnxruntime" in other.stderr
