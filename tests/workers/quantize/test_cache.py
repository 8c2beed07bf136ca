"""Variant cache keys: stable for the same inputs, different when anything that shapes the artifact changes."""

from __future__ import annotations

import shutil

from workers.quantize.cache import (
    BUILD_SOURCES,
    WORKERS_ROOT,
    cached_build_variant,
    source_digest,
    toolchain_versions,
    variant_cache_key,
)

SHA = "a" * 64


def _key(**overrides):
    arguments = {"model_sha256": SHA, "precision": "int8", "options": {"calibration_method": "mse", "per_channel": True}}
    arguments.update(overrides)
    return variant_cache_key(**arguments)


def test_key_is_stable_and_ignores_option_order():
    assert _key() == _key()
    assert _key(options={"per_channel": True, "calibration_method": "mse"}) == _key()
    assert len(_key()) == 64


def test_key_changes_with_model_precision_options_calibration_and_toolchain():
    keys = {
        _key(),
        _key(model_sha256="b" * 64),
        _key(precision="int8-dynamic"),
        _key(options={"calibration_method": "minmax", "per_channel": True}),
        _key(options={"calibration_method": "mse", "per_channel": True, "nodes_to_exclude": ["conv2"]}),
        _key(calibration_sha256="c" * 64),
        _key(versions={**toolchain_versions(), "onnxruntime": "0.0.1"}),
        _key(versions={**toolchain_versions(), "nncf": None}),
        _key(versions={**toolchain_versions(), "kiln_build": "0" * 64}),
    }
    assert len(keys) == 9


def test_toolchain_versions_name_every_tool():
    assert set(toolchain_versions()) == {"onnx", "onnxruntime", "nncf", "openvino", "kiln_build"}


def test_build_code_version_is_the_digest_of_the_build_sources():
    assert toolchain_versions()["kiln_build"] == source_digest(WORKERS_ROOT)
    for name in BUILD_SOURCES:
        assert (WORKERS_ROOT / name).exists(), name


def test_editing_the_build_code_changes_the_version_and_the_key(tmp_path):
    root = tmp_path / "workers"
    for name in BUILD_SOURCES:
        source = WORKERS_ROOT / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            root.mkdir(exist_ok=True)
            shutil.copyfile(source, root / name)
    before = source_digest(root)
    assert before == source_digest(WORKERS_ROOT) == source_digest(root)  # the same code, the same version
    recipe = root / "quantize" / "variants.py"
    recipe.write_text(recipe.read_text() + "\n# a recipe change\n")
    after = source_digest(root)
    assert after != before
    versions = toolchain_versions()
    assert _key(versions={**versions, "kiln_build": before}) == _key(versions={**versions, "kiln_build": before})
    assert _key(versions={**versions, "kiln_build": after}) != _key(versions={**versions, "kiln_build": before})
    (root / "learned" / "extra.py").write_text("X = 1\n")  # a new module counts too
    assert source_digest(root) != after


def test_second_build_is_served_from_the_cache(digits_path, digits_calibration, tmp_path):
    arguments = {"cache_dir": tmp_path / "cache", "model_path": digits_path, "precision": "int8",
                 "calibration_path": digits_calibration, "options": {"calibration_method": "minmax"}}
    first = cached_build_variant(out_path=tmp_path / "one.onnx", **arguments)
    second = cached_build_variant(out_path=tmp_path / "two.onnx", **arguments)
    assert (first["cache"], second["cache"]) == ("miss", "hit")
    assert first["cache_key"] == second["cache_key"]
    assert (tmp_path / "one.onnx").read_bytes() == (tmp_path / "two.onnx").read_bytes()
    assert second["recipe"] == first["recipe"] and second["backends"] == first["backends"]
    other = cached_build_variant(out_path=tmp_path / "three.onnx", **{**arguments, "options": {"calibration_method": "entropy"}})
    assert other["cache"] == "miss"
