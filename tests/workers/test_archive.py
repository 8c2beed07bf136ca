"""extract_model_archive against honest uploads and every trick a hostile zip can play."""

from __future__ import annotations

import stat
import struct
import zipfile
from pathlib import Path

import onnx
import pytest

from tests.fixtures.models import make_model_zip, save_with_external_data
from tests.workers.helpers import run_model
from workers.archive import UnsafeArchive, UnsupportedArchive, extract_model_archive

LIMIT = 50_000_000


def _zip(path: Path, entries: dict[str, bytes], *, compression=zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return path


def _model_bytes(model: onnx.ModelProto) -> bytes:
    return model.SerializeToString()


def _assert_nothing_left(dest: Path, outside: Path) -> None:
    assert not dest.exists() or not any(dest.iterdir())
    assert not (outside / "evil.txt").exists()


def test_extracts_model_with_external_data(transformer, tmp_path):
    zip_path = make_model_zip(transformer, tmp_path / "upload.zip")
    model_path = extract_model_archive(zip_path, tmp_path / "out", max_total_bytes=LIMIT)
    assert model_path == (tmp_path / "out" / "model.onnx").resolve()
    assert (tmp_path / "out" / "model.onnx.data").is_file()
    onnx.checker.check_model(str(model_path))
    import numpy as np

    (out,) = run_model(model_path, {"input": np.zeros((1, 16, 32), np.float32)})
    assert out.shape == (1, 16, 32)


def test_model_in_a_subfolder_is_found(digits, tmp_path):
    zip_path = _zip(tmp_path / "u.zip", {"bundle/": b"", "bundle/digits.onnx": _model_bytes(digits.model), "README.txt": b"hi"})
    model_path = extract_model_archive(zip_path, tmp_path / "out", max_total_bytes=LIMIT)
    assert model_path.name == "digits.onnx" and model_path.parent.name == "bundle"


@pytest.mark.parametrize("name", ["../evil.txt", "a/../../evil.txt", "..\\evil.txt"])
def test_zip_slip_is_refused(digits, tmp_path, name):
    zip_path = _zip(tmp_path / "u.zip", {"model.onnx": _model_bytes(digits.model), name: b"pwned"})
    dest = tmp_path / "sub" / "out"
    with pytest.raises(UnsafeArchive, match="outside the destination"):
        extract_model_archive(zip_path, dest, max_total_bytes=LIMIT)
    _assert_nothing_left(dest, tmp_path / "sub")
    assert not (tmp_path / "evil.txt").exists()


@pytest.mark.parametrize("name", ["/tmp/evil.txt", "C:/evil.txt", "c:evil.txt"])
def test_absolute_and_drive_paths_are_refused(digits, tmp_path, name):
    zip_path = _zip(tmp_path / "u.zip", {"model.onnx": _model_bytes(digits.model), name: b"pwned"})
    with pytest.raises(UnsafeArchive, match="outside the destination"):
        extract_model_archive(zip_path, tmp_path / "out", max_total_bytes=LIMIT)
    assert not (tmp_path / "out").exists()


def test_symlink_entry_is_refused(digits, tmp_path):
    zip_path = tmp_path / "u.zip"
    with zipfile.ZipFile(zip_path, "w") as archive:
        archive.writestr("model.onnx", _model_bytes(digits.model))
        link = zipfile.ZipInfo("model.onnx.data")
        link.create_system = 3
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(link, "/etc/passwd")
    with pytest.raises(UnsafeArchive, match="symbolic link"):
        extract_model_archive(zip_path, tmp_path / "out", max_total_bytes=LIMIT)
    assert not (tmp_path / "out").exists()


def test_ratio_bomb_is_refused(digits, tmp_path):
    zip_path = _zip(tmp_path / "u.zip", {"model.onnx": _model_bytes(digits.model), "zeros.bin": b"\0" * 5_000_000})
    with pytest.raises(UnsafeArchive, match="zip bomb"):
        extract_model_archive(zip_path, tmp_path / "out", max_total_bytes=LIMIT, max_ratio=100)
    assert not (tmp_path / "out").exists()


def test_size_bomb_is_refused(digits, tmp_path):
    zip_path = _zip(
        tmp_path / "u.zip",
        {"model.onnx": _model_bytes(digits.model), "big.bin": bytes(range(256)) * 4000},
        compression=zipfile.ZIP_STORED,
    )
    with pytest.raises(UnsafeArchive, match="expands to more than"):
        extract_model_archive(zip_path, tmp_path / "out", max_total_bytes=500_000)


def test_lying_size_header_is_caught_while_streaming(digits, tmp_path):
    """Declared sizes claim a tiny file; the real bytes must not land on disk unchecked."""
    payload = bytes(range(256)) * 400
    zip_path = _zip(tmp_path / "u.zip", {"model.onnx": _model_bytes(digits.model), "data.bin": payload})
    raw = bytearray(zip_path.read_bytes())
    # Rewrite data.bin's uncompressed size to 10 bytes in both the local and the central header.
    central = raw.rfind(b"PK\x01\x02")
    struct.pack_into("<I", raw, central + 24, 10)
    local = raw.find(b"PK\x03\x04", 1)
    struct.pack_into("<I", raw, local + 22, 10)
    zip_path.write_bytes(bytes(raw))
    with pytest.raises((UnsafeArchive, UnsupportedArchive)):
        extract_model_archive(zip_path, tmp_path / "out", max_total_bytes=LIMIT, max_ratio=1000)
    assert not (tmp_path / "out").exists()


def test_too_many_entries_is_refused(digits, tmp_path):
    entries = {"model.onnx": _model_bytes(digits.model)} | {f"f{i}.txt": b"x" for i in range(20)}
    with pytest.raises(UnsafeArchive, match="21 entries"):
        extract_model_archive(_zip(tmp_path / "u.zip", entries), tmp_path / "out", max_total_bytes=LIMIT, max_entries=10)


def test_zero_onnx_files_is_refused(tmp_path):
    with pytest.raises(UnsafeArchive, match="no .onnx"):
        extract_model_archive(_zip(tmp_path / "u.zip", {"a.txt": b"x"}), tmp_path / "out", max_total_bytes=LIMIT)


def test_several_onnx_files_is_refused(digits, tmp_path):
    data = _model_bytes(digits.model)
    with pytest.raises(UnsafeArchive, match="2 .onnx files"):
        extract_model_archive(_zip(tmp_path / "u.zip", {"a.onnx": data, "b.ONNX": data}), tmp_path / "out", max_total_bytes=LIMIT)


def test_duplicate_entries_are_refused(digits, tmp_path):
    zip_path = tmp_path / "u.zip"
    with zipfile.ZipFile(zip_path, "w") as archive:
        archive.writestr("model.onnx", _model_bytes(digits.model))
        archive.writestr("x.bin", b"1")
        with pytest.warns(UserWarning, match="Duplicate name"):
            archive.writestr("x.bin", b"2")
    with pytest.raises(UnsafeArchive, match="more than once"):
        extract_model_archive(zip_path, tmp_path / "out", max_total_bytes=LIMIT)


def _zip_with_location(model: onnx.ModelProto, tmp_path: Path, location: str) -> Path:
    folder = tmp_path / "model"
    path = save_with_external_data(model, folder)
    saved = onnx.load(str(path), load_external_data=False)
    for tensor in saved.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    return _zip(tmp_path / "u.zip", {"model.onnx": saved.SerializeToString(), "model.onnx.data": (folder / "model.onnx.data").read_bytes()})


@pytest.mark.parametrize(
    ("location", "message"),
    [
        ("../outside.data", "not a plain relative path"),
        ("/etc/passwd", "not a plain relative path"),
        ("missing.data", "not in the archive"),
    ],
)
def test_external_data_location_must_stay_inside(transformer, tmp_path, location, message):
    (tmp_path / "outside.data").write_bytes(b"\0" * 100_000)
    zip_path = _zip_with_location(transformer, tmp_path, location)
    dest = tmp_path / "out"
    with pytest.raises(UnsafeArchive, match=message):
        extract_model_archive(zip_path, dest, max_total_bytes=LIMIT)
    assert not dest.exists()


def test_external_data_through_a_planted_symlink_dir_is_refused(transformer, tmp_path):
    """A location that resolves outside via a symlink already on disk is caught by resolve()."""
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "pre-existing.txt").write_text("keep me")
    (dest / "link").symlink_to(tmp_path)
    (tmp_path / "w.data").write_bytes(b"\0" * 100_000)
    zip_path = _zip_with_location(transformer, tmp_path, "link/w.data")
    with pytest.raises(UnsafeArchive, match="outside the archive"):
        extract_model_archive(zip_path, dest, max_total_bytes=LIMIT)
    # Only what this call created is removed.
    assert (dest / "pre-existing.txt").read_text() == "keep me"
    assert not (dest / "model.onnx").exists()


def test_external_data_reading_past_the_file_end_is_refused(transformer, tmp_path):
    folder = tmp_path / "model"
    path = save_with_external_data(transformer, folder)
    data = (folder / "model.onnx.data").read_bytes()
    zip_path = _zip(tmp_path / "u.zip", {"model.onnx": path.read_bytes(), "model.onnx.data": data[: len(data) // 2]})
    with pytest.raises(UnsafeArchive, match="past the end"):
        extract_model_archive(zip_path, tmp_path / "out", max_total_bytes=LIMIT)


def test_not_a_zip_is_unsupported(tmp_path):
    path = tmp_path / "u.zip"
    path.write_bytes(b"definitely not a zip")
    with pytest.raises(UnsupportedArchive):
        extract_model_archive(path, tmp_path / "out", max_total_bytes=LIMIT)
    assert not (tmp_path / "out").exists()


def test_corrupt_onnx_in_zip_is_refused(tmp_path):
    zip_path = _zip(tmp_path / "u.zip", {"model.onnx": b"\x00\xff" * 50})
    with pytest.raises(UnsafeArchive, match="cannot be read"):
        extract_model_archive(zip_path, tmp_path / "out", max_total_bytes=LIMIT)


def test_file_and_folder_with_the_same_name_are_refused(digits, tmp_path):
    zip_path = _zip(tmp_path / "u.zip", {"model.onnx": _model_bytes(digits.model), "a": b"file", "a/b.bin": b"x"})
    with pytest.raises(UnsafeArchive, match="clashes"):
        extract_model_archive(zip_path, tmp_path / "out", max_total_bytes=LIMIT)
    assert not (tmp_path / "out").exists()
