"""Why an uploaded file is not a model Kiln can use, in the user's terms: what the file is instead, and how to make a good one."""
from __future__ import annotations

from pathlib import Path

HOW_TO_EXPORT = ("Export an .onnx file from your framework, e.g. torch.onnx.export(model, example_input, \"model.onnx\") "
                 "for PyTorch or python -m tf2onnx.convert --saved-model DIR --output model.onnx for TensorFlow, then upload that file. "
                 "PyTorch models can also be uploaded as they are: a torch.export .pt2 or a traced TorchScript .pt.")

# First bytes of formats people upload by mistake, and what to call them.
SIGNATURES: list[tuple[bytes, str]] = [
    (b"PK\x03\x04", "a zip archive (a PyTorch .pt/.pth checkpoint saved with torch.save is one)"),
    (b"\x80", "a Python pickle (a PyTorch or scikit-learn checkpoint)"),
    (b"\x89HDF", "an HDF5 file (a Keras .h5 model)"),
    (b"\x93NUMPY", "a NumPy .npy array"),
    (b"GGUF", "a GGUF file (llama.cpp weights)"),
    (b"\x7fELF", "a compiled program"),
    (b"TFL3", "a TensorFlow Lite model"),
]


def _looks_like(head: bytes) -> str | None:
    for magic, description in SIGNATURES:
        if head.startswith(magic) or (magic == b"TFL3" and head[4:8] == magic):
            return description
    stripped = head.lstrip()
    if stripped[:1] in (b"{", b"["):
        return "a JSON text file"
    if stripped[:1] == b"<":
        return "an HTML or XML page (a download that saved a web page instead of the file?)"
    if head and all(32 <= byte < 127 or byte in (9, 10, 13) for byte in head[:256]):
        return "a text file"
    return None


def unreadable_model_message(*, path: Path, filename: str, parse_failed: bool, detail: str) -> str:
    """The 400 message for an upload that is not a usable ONNX model.

    `parse_failed`: the bytes are not an ONNX protobuf at all (then the parser's own text helps nobody);
    otherwise the model parsed but the ONNX checker refused it, and `detail` says why."""
    if not parse_failed:
        return (f"{filename} is an ONNX file, but the ONNX checker refuses it: {detail}. "
                "Re-export it with a current exporter (onnx.checker.check_model(onnx.load(path)) shows the same problem).")
    with open(path, "rb") as handle:
        head = handle.read(512)
    if not head:
        return f"{filename} is empty. {HOW_TO_EXPORT}"
    what = _looks_like(head)
    if what:
        return f"{filename} is not an ONNX model: it is {what}. {HOW_TO_EXPORT}"
    return (f"{filename} is not an ONNX model: its bytes do not read as one (it may be another format, or cut short "
            f"by an interrupted download). {HOW_TO_EXPORT}")
