"""What a variant's file holds: an ONNX model, a LiteRT (TFLite) flatbuffer, or an OpenVINO IR, each for its runtime.

A variant is built for the runtime that runs it (DESIGN section 8). ONNX Runtime reads the ONNX file
(and OpenVINO reads ONNX files that are not quantized); a LiteRT variant is converted on the host into
LiteRT's own format, a `.tflite` flatbuffer, which only LiteRT reads; an OpenVINO INT8 variant is
quantized by NNCF on OpenVINO's own model and kept as OpenVINO's IR (`model.xml` + `model.bin`),
which only OpenVINO reads. The pipeline moves one file per variant: its bytes say what it is, never
its name (the agent downloads every model under one name). The IR's two files therefore travel as
one uncompressed tar: OpenVINO has no portable single-file IR (a compiled blob is tied to the
plugin's version and the CPU), and OpenVINO reads the XML and the weights from memory, so the agent
never unpacks it.

Only the standard library: the agent imports this without the server.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

ONNX = "onnx"
TFLITE = "tflite"
OPENVINO_IR = "openvino-ir"
# The suffix an artifact of each format is stored, packaged and downloaded under.
SUFFIXES = {ONNX: ".onnx", TFLITE: ".tflite", OPENVINO_IR: ".openvino.tar"}
# The runtimes that read each format; None for ONNX, which every ONNX runtime Kiln has reads.
RUNTIMES = {TFLITE: ("litert",), OPENVINO_IR: ("openvino",)}
# A TFLite flatbuffer carries its file identifier at bytes 4..8 (after the root table offset).
_TFLITE_IDENTIFIER = b"TFL3"
# A POSIX tar header carries "ustar" at bytes 257..262; an ONNX protobuf never starts with a tar header.
_TAR_MAGIC_OFFSET, _TAR_MAGIC = 257, b"ustar"
IR_XML, IR_WEIGHTS = "model.xml", "model.bin"


def artifact_format(path: str | Path) -> str:
    """`tflite` for a LiteRT flatbuffer, `openvino-ir` for a packed OpenVINO IR, else `onnx` (the bytes decide, not the name)."""
    with open(path, "rb") as handle:
        head = handle.read(_TAR_MAGIC_OFFSET + len(_TAR_MAGIC))
    if head[4:8] == _TFLITE_IDENTIFIER:
        return TFLITE
    if head[_TAR_MAGIC_OFFSET:] == _TAR_MAGIC:
        return OPENVINO_IR
    return ONNX


def runtimes_for(path: str | Path) -> tuple[str, ...] | None:
    """The runtimes that can read this artifact, or None when it is ONNX (every ONNX runtime can)."""
    return RUNTIMES.get(artifact_format(path))


def suffix_for(path: str | Path) -> str:
    """The file suffix an artifact of this format is named with (`.onnx`, `.tflite`, `.openvino.tar`)."""
    return SUFFIXES[artifact_format(path)]


def pack_openvino_ir(xml_path: str | Path, weights_path: str | Path, out_path: str | Path) -> Path:
    """Pack an IR's `.xml` and `.bin` into one tar at `out_path`, under the names `read_openvino_ir` expects."""
    out_path = Path(out_path)
    # Fixed member metadata: the same IR packs to the same bytes, so its blob and cache key repeat.
    with tarfile.open(out_path, "w", format=tarfile.USTAR_FORMAT) as archive:
        for source, name in ((Path(xml_path), IR_XML), (Path(weights_path), IR_WEIGHTS)):
            info = tarfile.TarInfo(name)
            info.size = source.stat().st_size
            with open(source, "rb") as handle:
                archive.addfile(info, handle)
    return out_path


def read_openvino_ir(path: str | Path) -> tuple[bytes, bytes]:
    """The XML and the weights of a packed IR, as bytes (OpenVINO's `read_model` takes both from memory)."""
    with tarfile.open(path, "r:") as archive:
        members = {member.name: member for member in archive.getmembers() if member.isfile()}
        missing = sorted({IR_XML, IR_WEIGHTS} - set(members))
        if missing:
            raise ValueError(f"not an OpenVINO IR archive: {', '.join(missing)} missing")
        return tuple(archive.extractfile(members[name]).read() for name in (IR_XML, IR_WEIGHTS))  # type: ignore[return-value]

