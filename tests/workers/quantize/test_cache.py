"""Variant cache keys: stable for the same inputs, different when anything that shapes the artifact changes."""

from __future__ import annotations

from workers.quantize.cache import (
    cached_build_variant,
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
        _key(versions={**toolchain_versions(), "kiln_quantize": "999"}),
    }
    assert len(keys) == 9


def test_toolchain_versions_name_every_tool():
    assert set(toolchain_versions()) == {"onnx", "onnxruntime", "nncf", "kiln_quantize"}


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
