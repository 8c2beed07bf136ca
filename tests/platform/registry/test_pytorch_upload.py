"""PyTorch uploads: .pt2 and traced .pt are checked statically, exported to ONNX in the sandbox and shown like ONNX;
pickles, forbidden imports and custom code are refused with the reason and leave nothing behind."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from kiln.registry.models import Blob, Model
from kiln.registry.selectors import model_version_onnx_path
from tests.conftest import upload
from tests.fixtures import torch_models

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def private_blob_root(settings, tmp_path):
    settings.BLOB_ROOT = tmp_path / "blobs"
    settings.UPLOAD_TMP_DIR = tmp_path / "uploads"


def stored_files(settings) -> list:
    roots = [settings.BLOB_ROOT, settings.UPLOAD_TMP_DIR]
    return [p for root in roots if root.exists() for p in root.rglob("*") if p.is_file()]


@pytest.mark.parametrize(("maker", "filename", "source_format", "exporter"), [
    (torch_models.save_export, "tiny.pt2", "torch-export", "dynamo"),
    (torch_models.save_torchscript, "tiny.pt", "torchscript", "torchscript"),
])
def test_pytorch_upload_is_exported_and_shown_like_onnx(tenant, tmp_path, maker, filename, source_format, exporter):
    path = maker(tmp_path / filename)
    response = upload(tenant.client, "/api/v1/models/", path, name="tiny")
    assert response.status_code == 201, response.content
    version = response.json()["versions"][0]
    assert version["source_format"] == source_format
    assert version["signature"]["inputs"] == [{"name": "x", "dtype": "float32", "shape": [2, 1, 8, 8]}]
    assert version["signature"]["outputs"][0]["shape"] == [2, 10]
    assert version["op_histogram"].get("Conv") == 1 and version["parameter_count"] >= 4 * 9 + 4 + 256 * 10 + 10
    conversion = version["conversion"]
    assert conversion["exporter"] == exporter
    # TorchScript cannot go through torch.export; the fallback says why.
    assert (conversion["fallback_reason"] is None) == (exporter == "dynamo")
    assert conversion["parity"]["passed"] and conversion["parity"]["min_cosine"] >= 1 - 1e-4
    assert sum(conversion["torch_op_histogram"].values()) >= 4 and conversion["torch_parameter_count"] == 4 * 9 + 4 + 256 * 10 + 10
    # The original file stays the version's download; the ONNX the pipeline uses matches PyTorch.
    downloaded = tenant.client.get(version["download_url"])
    assert b"".join(downloaded.streaming_content) == path.read_bytes()
    onnx_path = model_version_onnx_path(Model.objects.get(pk=response.json()["id"]).versions.get())
    x = torch_models.example_input(2)
    expected = torch_models.tiny_net()(x).detach().numpy()
    got = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, expected, atol=1e-5)


def _refused(tenant, settings, path: Path, code: str) -> str:
    response = upload(tenant.client, "/api/v1/models/", path)
    assert response.status_code == 400, response.content
    assert response.json()["code"] == code, response.json()
    assert Model.objects.count() == 0 and Blob.objects.count() == 0
    assert stored_files(settings) == []
    return response.json()["error"]


def test_pickled_state_dict_is_refused_and_leaves_nothing(tenant, settings, tmp_path):
    message = _refused(tenant, settings, torch_models.save_state_dict(tmp_path / "weights.pt"), "pickle_refused")
    assert "state_dict" in message and "torch.export" in message


def test_plain_pickle_is_refused(tenant, settings, tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"\x80\x04" + torch_models.MALICIOUS_PICKLE)
    assert "never unpickles" in _refused(tenant, settings, path, "pickle_refused")


def test_pt2_that_imports_a_forbidden_module_is_refused_with_the_reason(tenant, settings, tmp_path):
    path = torch_models.save_export_with_forbidden_import(tmp_path / "evil.pt2", tmp_path)
    message = _refused(tenant, settings, path, "forbidden_import")
    assert "os.system" in message and "constant_0" in message
    assert not Path("/tmp/kiln-pwned").exists()


def test_torchscript_with_custom_operators_is_refused_with_the_reason(tenant, settings, tmp_path):
    path = torch_models.save_torchscript_with_custom_op(tmp_path / "custom.pt", tmp_path)
    assert "my_company" in _refused(tenant, settings, path, "custom_code")


def test_scripted_torchscript_without_example_inputs_fails_readably(tenant, settings, tmp_path):
    import torch

    path = tmp_path / "scripted.pt"
    torch.jit.script(torch_models.tiny_net()).save(str(path))
    message = _refused(tenant, settings, path, "conversion_failed")
    assert "traced" in message and "kiln-torch-" not in message


def test_torchscript_that_would_write_a_server_file_is_refused_naming_the_operator(tenant, settings, tmp_path):
    """Issue #22: torch.from_file(shared=True) created a root-owned file in /tmp; now the upload is refused and nothing is written."""
    marker = Path("/tmp") / f"kiln-from-file-{os.getpid()}"
    path = torch_models.save_file_writer(tmp_path / "writer.pt", marker)
    message = _refused(tenant, settings, path, "forbidden_operator")
    assert "aten::from_file" in message
    assert not marker.exists()


def test_torchscript_that_would_read_a_server_file_gets_nothing_back(tenant, settings, tmp_path):
    """The reader's IndexError would carry /etc/os-release's bytes into the 400; it is refused before it runs."""
    path = torch_models.save_file_reader(tmp_path / "reader.pt", Path("/etc/os-release"), tmp_path)
    message = _refused(tenant, settings, path, "forbidden_operator")
    content = Path("/etc/os-release").read_bytes()[:4]
    assert "aten::from_file" in message and "out of bounds" not in message
    assert not any(f"index {byte}" in message for byte in content)
