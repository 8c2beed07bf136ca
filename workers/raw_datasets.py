"""Turn raw data (a zip of images or WAV files, a text file of lines) into a dataset through its
declared recipe (kiln_contract/recipes.py), one sample at a time.

Memory holds one sample: each input's rows are appended to a scratch file as they are made, and
the `.npz` is assembled from those files at the end. Any sample that cannot be prepared stops the
build with its name, and nothing is left behind.
"""

from __future__ import annotations

import base64
import io
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kiln_contract import recipes
from kiln_contract.recipes import RecipeError

PREVIEWS = 4
# A preview shows one file of each class (class folder), up to this many classes, then fills up to PREVIEWS.
PREVIEW_CLASSES = 8
THUMBNAIL_SIDE = 96
MAX_SAMPLES = 1_000_000
MAX_LINE_CHARS = 100_000
# One raw file (an image, a recording) and all of them, uncompressed.
MAX_FILE_BYTES = 256 * 1024**2
MAX_RAW_BYTES = 64 * 1024**3
LABELS = "labels"


def build_raw_dataset(raw_path: str | Path, recipe: dict[str, Any], out_path: str | Path, *, display_name: str,
                      tokenizer_json: str | None = None, max_bytes: int | None = None) -> dict[str, Any]:
    """Write the `.npz` a recipe makes of a raw upload; returns what inspect_dataset would, plus `previews`
    and the `label_names` its folders gave."""
    raw_path, out_path = Path(raw_path), Path(out_path)
    shown = None if recipe["type"] == "text" else set(preview_members(_zip_members(raw_path, recipe, display_name)))
    samples = _samples(raw_path, recipe, display_name, tokenizer_json)
    with tempfile.TemporaryDirectory(dir=out_path.parent, prefix=".raw-") as scratch:
        writer = _RowFiles(Path(scratch), max_bytes)
        previews, label_names = [], {}
        try:
            for name, tensors, label, preview in samples:
                label = _storable(label)
                if label is not None:
                    tensors = {**tensors, LABELS: np.asarray(label_names.setdefault(label, len(label_names)), np.int64)}
                writer.add(name, tensors)
                if (name in shown) if shown is not None else len(previews) < PREVIEWS:
                    previews.append(_storable(preview()))
            if not writer.count:
                raise RecipeError(f"{display_name} holds no {'lines' if recipe['type'] == 'text' else recipe['type'] + ' files'}")
            if label_names and writer.count != writer.counts.get(LABELS, 0):
                raise RecipeError("some files are in class folders and some are not: put every file in a folder named after its class, or none")
            arrays = writer.write_npz(out_path)
        except BaseException:
            writer.close()
            out_path.unlink(missing_ok=True)
            raise
    return {"samples": writer.count, "arrays": arrays, "has_labels": bool(label_names), "format": "npz",
            "previews": previews, "label_names": sorted(label_names, key=label_names.get)}


def preview_members(members: list[str]) -> list[str]:
    """The files a preview shows, in the zip's order: the first of each class folder (up to PREVIEW_CLASSES classes),
    then the first others, up to PREVIEWS files in all (or one a class, where there are more classes)."""
    chosen, classes = [], set()
    for member in members:
        label = recipes.member_label(member)
        if label is not None and label not in classes and len(classes) < PREVIEW_CLASSES:
            classes.add(label)
            chosen.append(member)
    for member in members:
        if len(chosen) >= max(PREVIEWS, len(classes)):
            break
        if member not in chosen:
            chosen.append(member)
    order = {member: index for index, member in enumerate(members)}
    return sorted(chosen, key=order.__getitem__)


def class_counts(members: list[str]) -> dict[str, int]:
    """Files per class folder, in the order the classes first appear ({} when no file is in a folder)."""
    counts: dict[str, int] = {}
    for member in members:
        label = recipes.member_label(member)
        if label is not None:
            counts[label] = counts.get(label, 0) + 1
    return counts


def _zip_members(raw_path: Path, recipe: dict[str, Any], display_name: str) -> list[str]:
    try:
        with zipfile.ZipFile(raw_path) as archive:
            return recipes.raw_members(archive.namelist(), recipe)
    except zipfile.BadZipFile:
        raise RecipeError(f"{display_name} is not a zip of {recipe['type']} files") from None


def preview_raw_dataset(raw_path: str | Path, recipe: dict[str, Any], *, display_name: str, names: list[str] | None = None) -> dict[str, Any]:
    """What a recipe makes of a few files of a zip before anything is uploaded for good: each input's tensor per sample
    (shape, dtype, range), a thumbnail of the tensor itself (after resizing and cropping) or a waveform, one file of each
    class, and how many files each class has.

    `names`, when given, are the paths of every file the user chose (the zip may hold only the ones to preview, so that
    a large folder need not travel twice); the counts are over them.
    """
    raw_path = Path(raw_path)
    if recipe["type"] == "text":
        raise RecipeError("a preview reads images or WAV files; a text recipe is checked when the dataset is uploaded")
    members = _zip_members(raw_path, recipe, display_name)
    counted = recipes.raw_members(names, recipe) if names is not None else members
    shown = set(preview_members(members))
    arrays, previews = {}, []
    for _name, tensors, label, preview in _samples(raw_path, recipe, display_name, None, only=shown):
        for key, value in tensors.items():
            arrays.setdefault(key, {"dtype": value.dtype.name, "shape": list(value.shape),
                                    "min": round(float(value.min()), 4) if value.size else None, "max": round(float(value.max()), 4) if value.size else None})
        previews.append(_storable({**preview(), "label": label}))
    if not previews:
        raise RecipeError(f"{display_name} holds no {recipe['type']} files")
    return {"files": len(counted), "arrays": arrays, "previews": previews, "classes": class_counts(counted)}


Sample = tuple[str, dict[str, np.ndarray], "str | None", Any]


def _storable(value):
    """`value` with every NUL in its text shown as ␀: a line or a file name may hold one, a database text column may not."""
    if isinstance(value, str):
        return value.replace("\x00", "\u2400")
    if isinstance(value, dict):
        return {_storable(key): _storable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_storable(item) for item in value]
    return value


def _samples(raw_path: Path, recipe: dict[str, Any], display_name: str, tokenizer_json: str | None,
             only: set[str] | None = None) -> Iterator[Sample]:
    """Every sample of the upload (of a zip, only the members in `only` when given)."""
    if recipe["type"] == "text":
        if not tokenizer_json:
            raise RecipeError("a text recipe needs the model's tokenizer.json")
        return _text_samples(raw_path, recipe, recipes.load_tokenizer(tokenizer_json, recipe))
    try:
        archive = zipfile.ZipFile(raw_path)
    except zipfile.BadZipFile:
        raise RecipeError(f"{display_name} is not a zip of {recipe['type']} files") from None
    return _file_samples(archive, recipe, only)


def _file_samples(archive: zipfile.ZipFile, recipe: dict[str, Any], only: set[str] | None = None) -> Iterator[Sample]:
    with archive:
        members = recipes.raw_members(archive.namelist(), recipe)
        if only is not None:
            members = [member for member in members if member in only]
        if len(members) > MAX_SAMPLES:
            raise RecipeError(f"the zip holds {len(members)} files, over the limit of {MAX_SAMPLES}")
        declared = sum(archive.getinfo(member).file_size for member in members)
        if declared > MAX_RAW_BYTES:
            raise RecipeError(f"the files in the zip hold {declared / 1024**2:.0f} MB uncompressed, over {MAX_RAW_BYTES / 1024**3:.0f} GB")
        for member in members:
            # A member's declared size bounds what is read: a zip bomb stops here, not in memory.
            if archive.getinfo(member).file_size > MAX_FILE_BYTES:
                raise RecipeError(f"{member} is over {MAX_FILE_BYTES / 1024**2:.0f} MB uncompressed")
            data = archive.read(member)
            tensors = recipes.prepare_file(member, data, recipe)
            yield member, tensors, recipes.member_label(member), lambda member=member, data=data, tensors=tensors: _preview(member, data, tensors, recipe)


def _text_samples(raw_path: Path, recipe: dict[str, Any], tokenizer) -> Iterator[Sample]:
    with open(raw_path, encoding="utf-8", errors="strict", newline=None) as lines:
        number = 0
        try:
            for number, line in enumerate(lines, start=1):
                text = line.rstrip("\n")
                if not text.strip():
                    continue
                if len(text) > MAX_LINE_CHARS:
                    raise RecipeError(f"line {number} is longer than {MAX_LINE_CHARS} characters")
                tensors = recipes.prepare_text(text, recipe, tokenizer)
                yield f"line {number}", tensors, None, lambda number=number, text=text: _text_preview(number, text, recipe, tokenizer)
        except UnicodeDecodeError:
            raise RecipeError(f"line {number + 1} is not UTF-8 text") from None


def tensor_image(tensor: np.ndarray, recipe: dict[str, Any]):
    """The image a prepared tensor holds, as the model gets it (its size, crop and colours), back in 0..255 pixels."""
    from PIL import Image

    pixels = np.asarray(tensor, np.float32)
    if recipe["layout"] == "NCHW":
        pixels = pixels.transpose(1, 2, 0)
    # normalize_image's arithmetic undone: (pixel * scale - mean) / std.
    pixels = (pixels * np.asarray(recipe["std"], np.float32) + np.asarray(recipe["mean"], np.float32)) / (recipe["scale"] or 1.0)
    if recipe["color"] == "BGR":
        pixels = pixels[:, :, ::-1]
    pixels = np.clip(np.rint(pixels), 0, 255).astype(np.uint8)
    return Image.fromarray(pixels[:, :, 0], "L") if pixels.shape[2] == 1 else Image.fromarray(pixels, "RGB")


def _thumbnail(image):
    """At most THUMBNAIL_SIDE a side; a small input is enlarged by whole pixels, so that 8x8 shows as 8x8 blocks."""
    from PIL import Image

    if max(image.size) < THUMBNAIL_SIDE:
        factor = THUMBNAIL_SIDE // max(image.size)
        return image.resize((image.width * factor, image.height * factor), Image.NEAREST)
    image.thumbnail((THUMBNAIL_SIDE, THUMBNAIL_SIDE))
    return image


def _preview(member: str, data: bytes, tensors: dict[str, np.ndarray], recipe: dict[str, Any]) -> dict[str, Any]:
    if recipe["type"] == "image":
        fed = tensor_image(tensors[recipe["input"]], recipe)
        buffer = io.BytesIO()
        _thumbnail(fed).save(buffer, format="PNG")
        return {"name": member, "thumbnail": "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode(),
                "size": [fed.height, fed.width]}
    waveform = tensors[recipe["input"]].astype(np.float32)
    if recipe.get("chunk"):
        # The chunks without the context each call repeats: the recording as prepared.
        waveform = waveform.reshape(len(waveform), -1)[:, recipe.get("context", 0):].reshape(-1)
    return {"name": member, "seconds": round(len(waveform) / recipe["sample_rate"], 3), "sample_rate": recipe["sample_rate"],
            "peak": round(float(np.abs(waveform).max(initial=0.0)), 4),
            "envelope": [round(float(np.abs(part).max(initial=0.0)), 3) for part in np.array_split(waveform, 32)]}


def _text_preview(number: int, text: str, recipe: dict[str, Any], tokenizer) -> dict[str, Any]:
    feeds_ids = any(recipes.text_field(spec) == "ids" for spec in recipe["inputs"].values())
    encoding = tokenizer.encode(text)
    # Padding is not shown: the tokens are those the attention mask keeps.
    tokens = [token for token, kept in zip(encoding.tokens, encoding.attention_mask, strict=True) if token and kept] if feeds_ids else []
    return {"name": f"line {number}", "text": text[:160], "tokens": tokens[:24], "length": int(sum(encoding.attention_mask))}


class _RowFiles:
    """One scratch file per array, rows appended in order; every row of an array has one shape and dtype."""

    def __init__(self, directory: Path, max_bytes: int | None):
        self.directory, self.max_bytes = directory, max_bytes
        self.handles: dict[str, Any] = {}
        self.first: dict[str, np.ndarray] = {}
        self.counts: dict[str, int] = {}
        self.first_name = ""
        self.count = 0
        self.bytes = 0

    def add(self, name: str, tensors: dict[str, np.ndarray]) -> None:
        if not self.first:
            self.first_name = name
        for key, value in tensors.items():
            first = self.first.setdefault(key, value)
            if value.shape != first.shape or value.dtype != first.dtype:
                raise RecipeError(f"{name}: the recipe made {key!r} of shape {list(value.shape)} but {self.first_name} made "
                                  f"{list(first.shape)}; every sample must come out the same shape (set size or length in the recipe)")
            if key not in self.handles:
                self.handles[key] = (self.directory / f"{len(self.handles)}.rows").open("wb")  # closed by write_npz or close
            handle = self.handles[key]
            handle.write(np.ascontiguousarray(value).tobytes())
            self.counts[key] = self.counts.get(key, 0) + 1
            self.bytes += value.nbytes
        if self.max_bytes is not None and self.bytes > self.max_bytes:
            raise RecipeError(f"the prepared arrays exceed this server's limit of {self.max_bytes / 1024**2:.0f} MB (KILN_MAX_DATASET_BYTES)")
        self.count += 1

    def write_npz(self, out_path: Path) -> dict[str, dict[str, Any]]:
        arrays = {}
        with zipfile.ZipFile(out_path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for index, (key, handle) in enumerate(self.handles.items()):
                handle.close()
                first = self.first[key]
                shape = (self.counts[key], *first.shape)
                header = {"descr": np.lib.format.dtype_to_descr(first.dtype), "fortran_order": False, "shape": shape}
                with archive.open(f"{key}.npy", "w", force_zip64=True) as member, open(self.directory / f"{index}.rows", "rb") as rows:
                    np.lib.format.write_array_header_2_0(member, header)
                    shutil.copyfileobj(rows, member, 1 << 20)
                arrays[key] = {"dtype": first.dtype.name, "shape": list(shape)}
        return arrays

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()
