"""Reuse host-side variants: the same model bytes, recipe, calibration data and toolchain give the same artifact."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

import onnx

WORKERS_ROOT = Path(__file__).resolve().parents[1]
# The code that turns a model, a recipe and calibration data into a variant: these packages and the
# modules they read models and calibration data with. Any edit to them changes every cache key, so an
# upgrade never reuses an artifact that the new code would build differently (nothing to remember to bump).
BUILD_SOURCES = ("quantize", "learned", "convert.py", "datasets.py", "inspect.py")


def source_digest(root: Path, sources: tuple[str, ...] = BUILD_SOURCES) -> str:
    """sha256 over the relative path and bytes of every .py file in `sources` (files or packages) under `root`."""
    digest = hashlib.sha256()
    for name in sources:
        path = root / name
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            digest.update(file.relative_to(root).as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()


@lru_cache(maxsize=1)
def toolchain_versions() -> dict[str, str | None]:
    """Versions of everything that shapes a built variant, computed once per process (package versions
    from metadata: importing nncf costs seconds; Kiln's own build code as a digest of its sources)."""
    from importlib import metadata

    import onnxruntime

    def installed(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "nncf": installed("nncf"),
        # OpenVINO's ONNX frontend and save_model shape an OpenVINO IR build.
        "openvino": installed("openvino"),
        "kiln_build": source_digest(WORKERS_ROOT),
    }


def variant_cache_key(
    *,
    model_sha256: str,
    precision: str,
    options: dict[str, Any],
    calibration_sha256: str | None = None,
    versions: dict[str, str | None] | None = None,
) -> str:
    """A stable hex key for one build: model bytes, precision, options (order-free), calibration data, toolchain."""
    payload = {
        "model": model_sha256,
        "precision": precision,
        "options": _canonical(options or {}),
        "calibration": calibration_sha256,
        "toolchain": versions if versions is not None else toolchain_versions(),
    }
    encoded = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(encoded.encode()).hexdigest()


def file_sha256(path: str | Path) -> str:
    """sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def model_sha256(path: str | Path) -> str:
    """sha256 over a model file and its external-data files, so a changed weight file changes the key."""
    from workers.inspect import model_files

    digest = hashlib.sha256()
    for file in model_files(path):
        digest.update(file.name.encode())
        digest.update(file_sha256(file).encode())
    return digest.hexdigest()


def cache_entry(*, cache_dir: str | Path, model_path: str | Path, precision: str, options: dict[str, Any] | None,
                calibration_path: str | Path | None) -> tuple[str, Path]:
    """The cache key of one build and the folder its entry lives in (present or not)."""
    key = variant_cache_key(
        model_sha256=model_sha256(model_path), precision=precision, options=dict(options or {}),
        calibration_sha256=file_sha256(calibration_path) if calibration_path is not None else None,
    )
    return key, Path(cache_dir) / key[:2] / key


def cache_take(entry: Path, out_path: str | Path) -> dict[str, Any] | None:
    """A stored build's result, its artifact copied to `out_path`; None when the entry is not there."""
    if not (entry / "result.json").is_file():
        return None
    result = json.loads((entry / "result.json").read_text())
    _materialize(entry / "model.onnx", Path(out_path))
    return result


def cache_put(entry: Path, out_path: str | Path, result: dict[str, Any]) -> None:
    """Store a fresh build under its entry (atomically; two workers storing one key leave one complete copy)."""
    _store(entry, Path(out_path), result)


def cached_build_variant(
    *,
    cache_dir: str | Path,
    model_path: str | Path,
    precision: str,
    out_path: str | Path,
    calibration_path: str | Path | None = None,
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`build_variant`, but served from `cache_dir` when the same build was done before; adds `cache: hit|miss` and `cache_key`."""
    from workers.quantize.variants import build_variant

    options = dict(options or {})
    key, entry = cache_entry(cache_dir=cache_dir, model_path=model_path, precision=precision, options=options,
                             calibration_path=calibration_path)
    stored = cache_take(entry, out_path)
    if stored is not None:
        return {**stored, "cache": "hit", "cache_key": key}
    result = build_variant(model_path=model_path, precision=precision, out_path=out_path,
                           calibration_path=calibration_path, options=options)
    cache_put(entry, out_path, result)
    return {**result, "cache": "miss", "cache_key": key}


def _store(entry: Path, built: Path, result: dict[str, Any]) -> None:
    entry.parent.mkdir(parents=True, exist_ok=True)
    # Build the entry aside and rename it into place: a reader never sees half an entry, and two
    # workers storing the same key leave one complete copy.
    staging = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".{entry.name}."))
    try:
        _materialize(built, staging / "model.onnx")
        (staging / "result.json").write_text(json.dumps(result, sort_keys=True, default=str))
        try:
            os.replace(staging, entry)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)  # another worker stored it first
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _materialize(source: Path, target: Path) -> None:
    from devices.artifacts import ONNX, artifact_format
    from workers.convert import save_model
    from workers.inspect import model_files

    target.parent.mkdir(parents=True, exist_ok=True)
    # A LiteRT flatbuffer or a packed OpenVINO IR is one self-contained file; an ONNX model may have external data.
    if artifact_format(source) != ONNX or len(model_files(source)) == 1:
        shutil.copyfile(source, target)
    else:
        # External data is referenced by file name; re-save so the copy points at `<target>.data`.
        save_model(onnx.load(str(source)), target)


def _canonical(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(key): _canonical(value[key]) for key in sorted(value, key=str)}
    if isinstance(value, (list, tuple)):
        return [_canonical(item) for item in value]
    return value
