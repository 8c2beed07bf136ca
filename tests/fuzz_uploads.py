"""A Hypothesis harness over every parser a user's upload reaches: the same targets for the test suite (a bounded
number of examples, tests/platform/security/test_fuzz_uploads.py) and for `benchmarks/fuzz_uploads.py --minutes N`.

Two kinds of target, both the server's real code:

- web-side parsers, called directly (thousands of examples a minute): what runs in the web process itself before
  any sandbox (the PyTorch file's static scan and its load-time-code check, a zipped model's extraction, the tus
  headers, a recipe's JSON, a WAV header). Each may only return or raise the error the API turns into a 4xx.
- the upload API, through Django's test client (a few examples a second, each parse in the OS sandbox): ONNX, .pt2,
  TorchScript, zipped models, npz, HDF5, zips of images and WAV files, text, recipes and tus requests. Each answer
  must be below 500 and JSON.

Inputs are mutations of a valid file of each format (bit flips, cuts, inserted and spliced bytes, zip entries
rewritten) or plain random bytes, so the parsers get past their first check. Memory is watched as the web process's
resident size; the sandbox bounds its children.
"""
from __future__ import annotations

import io
import json
import struct
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

from kiln.core.errors import KilnError

IMAGE_RECIPE = {"type": "image", "input": "input", "size": [8, 8], "color": "L", "scale": 1 / 255, "layout": "NCHW"}
AUDIO_RECIPE = {"type": "audio", "input": "input", "sample_rate": 8000, "length": 800}
TEXT_RECIPE = {"type": "text", "inputs": {"input_ids": "ids", "attention_mask": "attention_mask"}, "max_length": 16}


# -- valid files of each format, made once -------------------------------------------------------

@cache
def _folder() -> Path:
    return Path(tempfile.mkdtemp(prefix="kiln-fuzz-seeds-"))


@cache
def seed(kind: str) -> bytes:
    """A small valid file of `kind`: what the mutations start from."""
    folder = _folder()
    if kind == "onnx":
        from tests.devices.conftest import build_tiny_cnn

        return build_tiny_cnn().SerializeToString()
    if kind == "onnx-zip":
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.writestr("model/model.onnx", seed("onnx"))
        return buffer.getvalue()
    if kind in ("pt2", "pt"):
        from tests.fixtures import torch_models

        maker = torch_models.save_export if kind == "pt2" else torch_models.save_torchscript
        return maker(folder / f"seed.{kind}").read_bytes()
    if kind == "npz":
        buffer = io.BytesIO()
        np.savez(buffer, input=np.zeros((2, 1, 8, 8), np.float32), labels=np.arange(2))
        return buffer.getvalue()
    if kind == "hdf5":
        import h5py

        with h5py.File(folder / "seed.h5", "w") as handle:
            handle["input"] = np.zeros((2, 1, 8, 8), np.float32)
        return (folder / "seed.h5").read_bytes()
    if kind == "png":
        from PIL import Image

        buffer = io.BytesIO()
        Image.fromarray((np.arange(64, dtype=np.uint8) * 4).reshape(8, 8)).save(buffer, format="PNG")
        return buffer.getvalue()
    if kind == "wav":
        import soundfile

        buffer = io.BytesIO()
        soundfile.write(buffer, np.sin(np.arange(800) / 10).astype(np.float32), 8000, format="WAV", subtype="PCM_16")
        return buffer.getvalue()
    if kind == "text":
        return b"a first line\nthe second one\n\nlast\n"
    if kind == "tokenizer":
        from tests.fixtures.text import train_tokenizer

        return train_tokenizer(folder / "tokenizer.json").read_bytes()
    raise KeyError(kind)


SEED_KINDS = ("onnx", "onnx-zip", "pt2", "pt", "npz", "hdf5", "png", "wav", "text", "tokenizer")


def warm_seeds() -> None:
    """Make every seed now (PyTorch's among them import torch): what a run then measures is the server's parsing."""
    for kind in SEED_KINDS:
        seed(kind)


def zipped(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


# -- mutations ------------------------------------------------------------------------------------

@st.composite
def mutated(draw, original: bytes) -> bytes:
    """`original` with a few edits: flipped bits, a cut, inserted or repeated bytes, an overwritten run."""
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 4))):
        edit = draw(st.sampled_from(["flip", "cut", "insert", "repeat", "overwrite", "number"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if edit == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif edit == "cut":
            data = data[:at] if draw(st.booleans()) else data[:at] + data[at + draw(st.integers(1, 64)):]
        elif edit == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=64))
        elif edit == "repeat" and data:
            data[at:at] = data[at:at + draw(st.integers(1, 256))] * draw(st.integers(2, 8))
        elif edit == "overwrite":
            run = draw(st.binary(min_size=1, max_size=16))
            data[at:at + len(run)] = run
        elif edit == "number" and len(data) >= at + 4:
            # Sizes and counts live in little-endian integers: make one huge, zero or negative.
            data[at:at + 4] = struct.pack("<I", draw(st.sampled_from([0, 1, 0x7FFFFFFF, 0xFFFFFFFF, 0x80000000])))
    return bytes(data)


def file_bytes(kind: str) -> st.SearchStrategy[bytes]:
    """Mutations of a valid `kind` file, its zip members rewritten too for zip formats, or plain random bytes."""
    original = seed(kind)
    strategies = [mutated(original), st.binary(max_size=2048)]
    if original[:2] == b"PK":
        strategies.append(_mutated_members(original))
    return st.one_of(*strategies)


@st.composite
def _mutated_members(draw, original: bytes) -> bytes:
    """A zip whose entries are mutated one by one (the container stays readable, what is inside does not)."""
    with zipfile.ZipFile(io.BytesIO(original)) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    names = sorted(members)
    for name in draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True)):
        members[name] = draw(mutated(members[name]))
    if draw(st.booleans()):
        members[draw(st.sampled_from(["../escape.pkl", "/abs.py", "code/x.py", "data.pkl", "a/" * 40 + "deep"]))] = draw(st.binary(max_size=64))
    return zipped(members)


json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                           max_leaves=20)


@st.composite
def recipe_text(draw) -> str:
    """Recipe JSON: a valid recipe with fields changed, dropped or added, any JSON, deep nesting, or plain text."""
    kind = draw(st.sampled_from(["edited", "json", "deep", "text"]))
    if kind == "edited":
        recipe = dict(draw(st.sampled_from([IMAGE_RECIPE, AUDIO_RECIPE, TEXT_RECIPE])))
        for key in draw(st.lists(st.sampled_from([*recipe, "flip", "constants", "chunk", "resize", "dtype"]), max_size=3)):
            if draw(st.booleans()):
                recipe[key] = draw(json_values)
            else:
                recipe.pop(key, None)
        return json.dumps(recipe)
    if kind == "json":
        return json.dumps(draw(json_values))
    if kind == "deep":
        depth = draw(st.integers(1, 5000))
        return "[" * depth + "]" * depth
    return draw(st.text(max_size=200))


# -- the web-side parsers, called as the server calls them ----------------------------------------

@dataclass(frozen=True)
class Inline:
    """A parser the web process runs itself, the errors the API turns into a 4xx, and what to feed it."""

    strategy: Callable[[], st.SearchStrategy]
    call: Callable[[object], object]
    allowed: Callable[[], tuple[type[BaseException], ...]]


def _scan_torch(data: bytes):
    from workers.pytorch.scan import scan_torch_file

    with tempfile.NamedTemporaryFile(suffix=".pt") as handle:
        handle.write(data)
        handle.flush()
        return scan_torch_file(handle.name, max_total_bytes=64 << 20)


def _extract_model_zip(data: bytes):
    from workers.archive import extract_model_archive

    with tempfile.TemporaryDirectory() as folder:
        archive = Path(folder) / "model.zip"
        archive.write_bytes(data)
        return extract_model_archive(archive, Path(folder) / "out", max_total_bytes=64 << 20)


def _load_time_code(text: str):
    from workers.pytorch.scan import check_load_time_code

    return check_load_time_code({"code/__torch__/m.py": "def __setstate__(self, state):\n" + text})


def _torch_errors():
    from workers.pytorch.scan import RefusedTorchFile

    return (RefusedTorchFile,)


def _archive_errors():
    from workers.archive import UnsafeArchive, UnsupportedArchive

    return (UnsafeArchive, UnsupportedArchive)


def _recipe_errors():
    from kiln_contract.recipes import RecipeError

    return (RecipeError,)


def _script_lines() -> st.SearchStrategy[str]:
    calls = st.sampled_from(["torch.add(x, 1)", "self.helper(state)", "(self).m(state)", "ops.aten.relu(x)", "mystery(x)",
                             "__torch__.m.f(x)", "x.append(1)", "getattr(self, \"1\")", "torch.from_file(\"/etc/passwd\", False, 4)"])
    line = st.one_of(calls.map(lambda call: f"  _0 = {call}"), st.text(max_size=40).map(lambda text: "  " + text))
    return st.lists(line, min_size=1, max_size=6).map("\n".join)


def _parse_metadata(header: str):
    from kiln.registry.uploads import parse_metadata

    return parse_metadata(header)


def _byte_count(header: str):
    from kiln.registry.api.views import _byte_count as byte_count

    return byte_count(header, "Upload-Length")


def _recipe(text: str):
    from kiln_contract.recipes import parse_recipe

    return parse_recipe(text)


def _wav_header(data: bytes):
    from kiln_contract.recipes import check_wav_header

    return check_wav_header(data)


def _kiln_errors():
    return (KilnError,)


INLINE: dict[str, Inline] = {
    "pytorch static scan (.pt)": Inline(lambda: file_bytes("pt"), _scan_torch, _torch_errors),
    "pytorch static scan (.pt2)": Inline(lambda: file_bytes("pt2"), _scan_torch, _torch_errors),
    "torchscript load-time code": Inline(_script_lines, _load_time_code, _torch_errors),
    "zipped onnx extraction": Inline(lambda: file_bytes("onnx-zip"), _extract_model_zip, _archive_errors),
    "tus Upload-Metadata": Inline(lambda: st.text(max_size=200), _parse_metadata, _kiln_errors),
    "tus byte counts": Inline(lambda: st.text(max_size=30), _byte_count, _kiln_errors),
    "recipe json": Inline(recipe_text, _recipe, _recipe_errors),
    "wav header": Inline(lambda: file_bytes("wav"), _wav_header, _recipe_errors),
}


def check_inline(name: str, value) -> None:
    """Run one web-side parser; anything but a return or its 4xx error is a finding (a 500 in the web process)."""
    target = INLINE[name]
    try:
        target.call(value)
    except target.allowed() as error:
        if isinstance(error, KilnError):
            assert error.status_code < 500, error
    except KilnError as error:
        assert error.status_code < 500, error


# -- the upload API -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Http:
    """An upload the API parses (in the sandbox behind it): what to feed it and the request that sends it."""

    strategy: Callable[[], st.SearchStrategy]
    send: Callable[[object, object], object]


def _post_file(client, url: str, filename: str, data: bytes, **fields):
    upload = io.BytesIO(data)
    upload.name = filename
    return client.post(url, {**fields, "file": upload}, format="multipart")


def _model(filename: str):
    return lambda client, data: _post_file(client, "/api/v1/models/", filename, data, name="fuzz")


def _dataset(filename: str, recipe: dict | None = None, tokenizer: bool = False):
    def send(client, data):
        fields = {"kind": "validation"}
        if recipe is not None:
            fields["recipe"] = json.dumps(recipe)
        if tokenizer:
            fields["tokenizer"] = io.BytesIO(seed("tokenizer"))
            fields["tokenizer"].name = "tokenizer.json"
        return _post_file(client, "/api/v1/datasets/", filename, data, **fields)
    return send


def _recipe_over_images(client, text: str):
    return _post_file(client, "/api/v1/datasets/", "digits.zip", zipped({"a/1.png": seed("png"), "b/2.png": seed("png")}),
                      kind="validation", recipe=text)


@st.composite
def tus_request(draw) -> dict:
    headers = st.one_of(st.sampled_from(["", "0", "10", "1_0", "+10", " 10", "١٠", "99999999999999999999", "-1"]), st.text(max_size=24))
    return {"length": draw(headers), "metadata": draw(st.one_of(st.just("filename ZnV6ei5vbm54"), st.text(max_size=80))),
            "offset": draw(headers), "content_length": draw(headers), "body": draw(st.binary(max_size=64)),
            "content_type": draw(st.sampled_from(["application/offset+octet-stream", "text/plain", ""]))}


def _tus(client, request: dict):
    created = client.post("/api/v1/uploads/", HTTP_UPLOAD_LENGTH=request["length"], HTTP_UPLOAD_METADATA=request["metadata"],
                          HTTP_TUS_RESUMABLE="1.0.0")
    if created.status_code != 201:
        return created
    return client.generic("PATCH", created["Location"], request["body"], content_type=request["content_type"],
                          HTTP_UPLOAD_OFFSET=request["offset"], HTTP_TUS_RESUMABLE="1.0.0",
                          **({"CONTENT_LENGTH": request["content_length"]} if request["content_length"] else {}))


@st.composite
def _images(draw) -> bytes:
    return zipped({"a/1.png": draw(file_bytes("png")), "b/2.png": seed("png")})


@st.composite
def _wavs(draw) -> bytes:
    return zipped({"a.wav": draw(file_bytes("wav"))})


HTTP: dict[str, Http] = {
    "onnx model": Http(lambda: file_bytes("onnx"), _model("fuzz.onnx")),
    "zipped onnx model": Http(lambda: file_bytes("onnx-zip"), _model("fuzz.zip")),
    "torch.export .pt2": Http(lambda: file_bytes("pt2"), _model("fuzz.pt2")),
    "torchscript .pt": Http(lambda: file_bytes("pt"), _model("fuzz.pt")),
    "npz dataset": Http(lambda: file_bytes("npz"), _dataset("fuzz.npz")),
    "hdf5 dataset": Http(lambda: file_bytes("hdf5"), _dataset("fuzz.h5")),
    "images through a recipe": Http(_images, _dataset("fuzz.zip", IMAGE_RECIPE)),
    "wav through a recipe": Http(_wavs, _dataset("fuzz.zip", AUDIO_RECIPE)),
    "text through a recipe": Http(lambda: file_bytes("text"), _dataset("fuzz.txt", TEXT_RECIPE, tokenizer=True)),
    "recipe field": Http(recipe_text, _recipe_over_images),
    "tus headers": Http(tus_request, _tus),
}


def check_http(name: str, client, value) -> int:
    """Send one upload; a 5xx, or an error that is not JSON, is a finding. Returns the status."""
    response = HTTP[name].send(client, value)
    body = response.content.decode("utf-8", errors="replace")
    assert response.status_code < 500, f"{name}: {response.status_code} {body[:500]}"
    if response.status_code >= 400 and response.status_code != 405:
        assert response["Content-Type"].startswith("application/json") and "error" in response.json(), f"{name}: {body[:500]}"
    return response.status_code
