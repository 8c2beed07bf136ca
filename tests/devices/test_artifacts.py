"""Artifact formats: the bytes say what a variant's file is, and a packed OpenVINO IR reads back whole."""

from __future__ import annotations

import onnx
import pytest

from devices.artifacts import (
    ONNX,
    OPENVINO_IR,
    TFLITE,
    artifact_format,
    pack_openvino_ir,
    read_openvino_ir,
    runtimes_for,
    suffix_for,
)
from tests.devices.conftest import build_tiny_cnn


def test_an_ir_packs_into_one_file_that_reads_back_byte_for_byte(tmp_path):
    xml, weights = tmp_path / "net.xml", tmp_path / "net.bin"
    xml.write_bytes(b"<net name='x'/>")
    weights.write_bytes(bytes(range(256)) * 3)
    packed = pack_openvino_ir(xml, weights, tmp_path / "variant.onnx")
    # Named .onnx on purpose: the agent downloads every model under that name, and the bytes decide.
    assert artifact_format(packed) == OPENVINO_IR
    assert runtimes_for(packed) == ("openvino",)
    assert suffix_for(packed) == ".openvino.tar"
    assert read_openvino_ir(packed) == (xml.read_bytes(), weights.read_bytes())


def test_onnx_and_tflite_files_keep_their_formats(tmp_path):
    model = tmp_path / "model.onnx"
    onnx.save(build_tiny_cnn(), str(model))
    assert artifact_format(model) == ONNX and runtimes_for(model) is None
    flatbuffer = tmp_path / "model.bin"
    flatbuffer.write_bytes(b"\x1c\x00\x00\x00TFL3" + bytes(300))
    assert artifact_format(flatbuffer) == TFLITE


def test_a_tar_without_the_ir_files_is_refused(tmp_path):
    import tarfile

    stray = tmp_path / "notes.txt"
    stray.write_text("hello")
    archive_path = tmp_path / "other.tar"
    with tarfile.open(archive_path, "w", format=tarfile.USTAR_FORMAT) as archive:
        archive.add(stray, arcname="notes.txt")
    with pytest.raises(ValueError, match="model.bin, model.xml missing"):
        read_openvino_ir(archive_path)
