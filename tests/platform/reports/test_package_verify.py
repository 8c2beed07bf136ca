"""A package verifies only when nothing that could run is unsigned; run.py runs only the bytes it verified.

Packages are built here as the server builds them (kiln.reports.packaging: the same files, a manifest signed
with an Ed25519 key), without a job, so each attack is pinned in a second: the planted unchecked-hash .pyc of
issue 34, a module beside run.py that shadows one run.py imports, and a user's own data kept beside run.py
(issue 37 item 5), which is not the package's business.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import py_compile
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kiln_client import package_run
from kiln_contract import feeds, recipes
from tests.devices.conftest import build_tiny_cnn

IMAGE_RECIPE = {"type": "image", "input": "input", "size": [8, 8], "resize": "stretch", "color": "L", "scale": 1 / 255,
                "mean": [0.0], "std": [1.0], "layout": "NCHW", "dtype": "float32"}


def _pem(key) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def build_package(root: Path, *, recipe: dict | None = None) -> Path:
    """A signed package of the tiny CNN in `root`; returns the PEM of the key that signed it (to pin)."""
    root.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    onnx.save(build_tiny_cnn(), str(root / "model.onnx"))
    (root / "run.py").write_text(Path(package_run.__file__).read_text())
    (root / "kiln_feeds.py").write_text(Path(feeds.__file__).read_text())
    (root / "signing-key.pem").write_bytes(_pem(key))
    names = {"model.onnx": "model", "run.py": "script", "kiln_feeds.py": "script", "signing-key.pem": "signing-key"}
    if recipe:
        (root / "kiln_recipe.py").write_text(Path(recipes.__file__).read_text())
        names["kiln_recipe.py"] = "script"
    files = [{"path": name, "original_path": name, "role": role, "sha256": hashlib.sha256((root / name).read_bytes()).hexdigest(),
              "encrypted": False} for name, role in names.items()]
    manifest = {"format": "kiln-package/1", "job": 1, "backend": "onnxruntime", "compile": {}, "recipe": recipe, "feeds": None,
                "variant": {"key": "fp32", "precision": "fp32"}, "signing_key_fingerprint": "test", "files": files,
                "signature": {"inputs": [{"name": "input", "dtype": "float32", "shape": ["batch", 1, 8, 8]}],
                              "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", 10]}]}}
    manifest_bytes = json.dumps(manifest, indent=2, sort_keys=True).encode()
    (root / "manifest.json").write_bytes(manifest_bytes)
    (root / "manifest.sig").write_bytes(base64.b64encode(key.sign(manifest_bytes)))
    pem = root.parent / f"{root.name}.pem"
    pem.write_bytes(_pem(key))
    return pem


def run_py(root: Path, *args, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "run.py", *map(str, args)], cwd=root, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def plant_unchecked_pyc(root: Path, module: str, marker: Path) -> Path:
    """Issue 34's attack: a .pyc in unchecked-hash form, which Python runs without comparing it with the signed .py."""
    source = root.parent / f"{module}-evil.py"
    source.write_text(f"open({str(marker)!r}, 'w').write('planted code ran')\n")
    target = root / "__pycache__" / f"{module}.{sys.implementation.cache_tag}.pyc"
    py_compile.compile(str(source), cfile=str(target), dfile=f"{module}.py", invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    return target


@pytest.fixture
def package(tmp_path):
    root = tmp_path / "package"
    return root, build_package(root)


def test_a_planted_unchecked_hash_pyc_fails_verification_and_never_runs(package, tmp_path):
    root, pem = package
    marker = tmp_path / "pwned"
    plant_unchecked_pyc(root, "kiln_feeds", marker)
    np.savez(root / "inputs.npz", input=np.zeros((2, 1, 8, 8), np.float32))
    with pytest.raises(package_run.VerificationFailed, match=r"__pycache__/kiln_feeds\.cpython-\d+\.pyc"):
        package_run.verify(root, pem.read_bytes())
    ran = run_py(root, "inputs.npz", "--runs", "2", "--public-key", pem)
    assert ran.returncode == 2 and "__pycache__/kiln_feeds" in ran.stderr, ran.stdout + ran.stderr
    assert not marker.exists()


def test_helpers_load_from_their_verified_source_never_from_a_pyc(package, tmp_path):
    # Even past verify (a check skipped, a file planted after it), the helper is compiled from the signed bytes.
    root, pem = package
    marker = tmp_path / "pwned"
    plant_unchecked_pyc(root, "kiln_feeds", marker)
    manifest = json.loads((root / "manifest.json").read_text())
    sys.modules.pop("kiln_feeds", None)
    try:
        module = package_run.load_helper(root, manifest, "kiln_feeds")
        assert module.needs_calls is not None and module.__file__ == str(root / "kiln_feeds.py")
    finally:
        sys.modules.pop("kiln_feeds", None)
    assert not marker.exists()
    # And a helper changed after verification is refused, not run.
    (root / "kiln_feeds.py").write_text(f"open({str(marker)!r}, 'w').write('swapped')\n")
    with pytest.raises(package_run.VerificationFailed, match="changed after it was verified"):
        package_run.load_helper(root, manifest, "kiln_feeds")
    sys.modules.pop("kiln_feeds", None)
    assert not marker.exists()


def test_run_py_writes_no_bytecode_and_a_module_beside_it_shadows_nothing(package, tmp_path):
    # `python run.py` puts its folder first on sys.path: a planted numpy.py would run before any check.
    root, pem = package
    marker = tmp_path / "shadowed"
    (root / "numpy.py").write_text(f"open({str(marker)!r}, 'w').write('ran before verification')\n")
    np.savez(root / "inputs.npz", input=np.zeros((2, 1, 8, 8), np.float32))
    ran = run_py(root, "inputs.npz", "--runs", "2", "--public-key", pem)
    assert ran.returncode == 2 and "numpy.py" in ran.stderr, ran.stdout + ran.stderr
    assert not marker.exists()
    (root / "numpy.py").unlink()
    ran = run_py(root, "inputs.npz", "--runs", "2", "--public-key", pem)
    assert ran.returncode == 0, ran.stderr
    assert not list(root.rglob("__pycache__")) and not list(root.rglob("*.pyc"))


@pytest.mark.parametrize("planted", ["helper.py", "sitecustomize.pth", "native.so", "lib.so.1", "photos/evil.py",
                                     "compiled/extra.bin", "__pycache__/notes.txt", "__pycache__/run.cpython-311.opt-1.pyc"])
def test_unsigned_code_anywhere_in_the_package_fails_verification(package, planted):
    root, pem = package
    (root / "compiled").mkdir()
    (root / "compiled" / "engine.bin").write_bytes(b"engine")
    # compiled/ is one of the package's own folders once the manifest lists a file in it.
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["files"].append({"path": "compiled/engine.bin", "original_path": "compiled/engine.bin", "role": "compiled",
                              "sha256": hashlib.sha256(b"engine").hexdigest(), "encrypted": False})
    key = Ed25519PrivateKey.generate()
    manifest_bytes = json.dumps(manifest).encode()
    (root / "manifest.json").write_bytes(manifest_bytes)
    (root / "manifest.sig").write_bytes(base64.b64encode(key.sign(manifest_bytes)))
    package_run.verify(root, _pem(key))
    path = root / planted
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    with pytest.raises(package_run.VerificationFailed, match="files not in the manifest"):
        package_run.verify(root, _pem(key))


def test_a_users_own_data_beside_run_py_is_not_the_packages_business(package, tmp_path):
    root, pem = package
    np.savez(root / "inputs.npz", input=np.zeros((2, 1, 8, 8), np.float32))
    (root / "outputs.npz").write_bytes(b"not even an npz")
    (root / "photos").mkdir()
    (root / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    (root / "notes.txt").write_text("mine")
    package_run.verify(root, pem.read_bytes())
    ran = run_py(root, "inputs.npz", "--runs", "2", "--public-key", pem)
    assert ran.returncode == 0, ran.stderr
    assert "p50" in ran.stdout and "WARNING" not in ran.stderr


def test_run_py_without_a_pinned_key_says_it_trusts_the_packages_own_key(package):
    root, _ = package
    ran = run_py(root, "--verify-only")
    assert ran.returncode == 0, ran.stderr
    assert "WARNING: no --public-key given" in ran.stderr and "trusts the key inside this package" in ran.stderr
    assert "not pinned" in ran.stdout


def test_run_py_smoke_tests_on_random_inputs(package):
    root, pem = package
    ran = run_py(root, "--random", "--runs", "2", "--public-key", pem, "--save-outputs", "out.npz")
    assert ran.returncode == 0, ran.stderr
    with np.load(root / "out.npz") as outputs:
        assert outputs["logits"].shape == (1, 10)


def test_run_py_prepares_an_image_a_folder_of_images_and_a_zip_with_the_packages_recipe(tmp_path):
    from PIL import Image

    root = tmp_path / "package"
    pem = build_package(root, recipe=IMAGE_RECIPE)
    pixels = np.arange(64, dtype=np.uint8).reshape(8, 8) * 3
    (tmp_path / "photos" / "circle").mkdir(parents=True)
    Image.fromarray(pixels).save(tmp_path / "photos" / "circle" / "a.png")
    Image.fromarray(255 - pixels).save(tmp_path / "photos" / "circle" / "b.png")
    import onnxruntime as ort

    session = ort.InferenceSession(str(root / "model.onnx"))
    expected = session.run(None, {"input": (pixels.astype(np.float32) / 255)[None, None]})[0]
    ran = run_py(root, tmp_path / "photos" / "circle" / "a.png", "--public-key", pem, "--save-outputs", tmp_path / "one.npz")
    assert ran.returncode == 0, ran.stderr
    with np.load(tmp_path / "one.npz") as outputs:
        np.testing.assert_allclose(outputs["logits"], expected, rtol=1e-5, atol=1e-5)
    ran = run_py(root, tmp_path / "photos", "--public-key", pem, "--save-outputs", tmp_path / "all.npz")
    assert ran.returncode == 0, ran.stderr
    with np.load(tmp_path / "all.npz") as outputs:
        assert outputs["logits"].shape == (2, 10)
    import shutil

    shutil.make_archive(str(tmp_path / "photos"), "zip", tmp_path / "photos")
    ran = run_py(root, tmp_path / "photos.zip", "--public-key", pem, "--save-outputs", tmp_path / "zipped.npz")
    assert ran.returncode == 0, ran.stderr
    with np.load(tmp_path / "zipped.npz") as outputs:
        np.testing.assert_allclose(outputs["logits"][:1], expected, rtol=1e-5, atol=1e-5)
    wrong = run_py(root, root / "signing-key.pem", "--public-key", pem)
    assert wrong.returncode != 0 and "recipe reads image input" in wrong.stderr and "Traceback" not in wrong.stderr


def test_a_missing_runtime_ends_with_the_install_command_not_a_traceback(package, tmp_path):
    root, pem = package
    blocker = tmp_path / "no-onnxruntime"
    blocker.mkdir()
    (blocker / "onnxruntime.py").write_text("raise ModuleNotFoundError(\"No module named 'onnxruntime'\", name='onnxruntime')\n")
    ran = run_py(root, "--random", "--public-key", pem, env={"PYTHONPATH": os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")])})
    assert ran.returncode != 0
    assert "onnxruntime is not installed on this machine: pip install onnxruntime" in ran.stderr and "Traceback" not in ran.stderr
