"""What a variant's file holds: an ONNX model, or a LiteRT (TFLite) flatbuffer built for LiteRT alone.

A variant is built for the runtime that runs it (DESIGN section 8). ONNX Runtime and OpenVINO read
the same ONNX file; a LiteRT variant is converted on the host into LiteRT's own format, a `.tflite`
flatbuffer, which only LiteRT reads. The pipeline moves one file per variant: its bytes say what it
is, never its name (the agent downloads every model under one name).

Only the standard library: the agent imports this without the server.
"""

from __future__ import annotations

from pathlib import Path

ONNX = "onnx"
TFLITE = "tflite"
# The suffix an artifact of each format is stored, packaged and downloaded under.
SUFFIXES = {ONNX: ".onnx", TFLITE: ".tflite"}
# The runtimes that read each format; None for ONNX, which every ONNX runtime Kiln has reads.
RUNTIMES = {TFLITE: ("litert",)}
# A TFLite flatbuffer carries its file identifier at bytes 4..8 (after the root table offset).
_TFLITE_IDENTIFIER = b"TFL3"


def artifact_format(path: str | Path) -> str:
    """`tflite` for a LiteRT flatbuffer, else `onnx` (the file's bytes decide, not its name)."""
    with open(path, "rb") as handle:
        head = handle.read(8)
    return TFLITE if head[4:8] == _TFLITE_IDENTIFIER else ONNX


def runtimes_for(path: str | Path) -> tuple[str, ...] | None:
    """The runtimes that can read this artifact, or None when it is ONNX (every ONNX runtime can)."""
    return RUNTIMES.get(artifact_format(path))


def suffix_for(path: str | Path) -> str:
    """The file suffix an artifact of this format is named with (`.onnx`, `.tflite`)."""
    return SUFFIXES[artifact_format(path)]
