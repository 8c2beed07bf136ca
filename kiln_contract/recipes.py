"""Declared preprocessing: how one raw file (an image, a WAV, a line of text) becomes the tensors a
model input takes.

The same code runs when Kiln turns an upload into a dataset and in a deployment package's
`run.py` (this file is copied into every package whose job used a recipe), so the accuracy Kiln
measured is the accuracy of what the package does with raw input. Only numpy is imported here;
Pillow, soundfile and tokenizers are imported when a recipe needs them.

Recipes (JSON):

    {"type": "image", "input": "images", "size": [320, 320], "resize": "stretch" | "shorter_side_crop",
     "color": "RGB" | "BGR" | "L", "scale": "1/255", "mean": [0, 0, 0], "std": [1, 1, 1],
     "layout": "NCHW" | "NHWC", "dtype": "float32"}
    {"type": "audio", "input": "input", "sample_rate": 16000, "resample": false, "length": 16000, "dtype": "float32",
     "chunk": 512, "context": 64, "batch_axis": true, "constants": {"sr": 16000}}
    {"type": "text", "inputs": {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"},
     "max_length": 64, "dtype": "int64"}

A text input may also be an object, for models that take a token array in another form:
`{"field": "attention_mask", "dtype": "float32", "shape": [1, 1, 64], "additive": -30}` feeds the
mask as an additive bias (0 where a token is, -30 on padding; float32 unless a dtype is given)
shaped `[1, 1, 64]` per sample.

Each sample's tensors carry no batch axis; a dataset stacks them batch-first. An audio recipe with
a `chunk` makes each recording a sequence of calls for a streaming model: step t feeds the `context`
samples before chunk t and the chunk (`[steps, 1, context + chunk]` with `batch_axis`), and each
of `constants` (a scalar input such as a sample rate) is fed on every call.
"""

from __future__ import annotations

import io
import json
import math
import re
import struct
from typing import Any

import numpy as np

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
AUDIO_SUFFIXES = (".wav",)
TYPES = ("image", "audio", "text")
MAX_IMAGE_SIDE = 4096
# Pixels an image may declare before it is decoded (Pillow's own bomb warning starts at 89 M).
MAX_IMAGE_PIXELS = 89_478_485
MAX_AUDIO_SECONDS = 600
MAX_TEXT_LENGTH = 8192
TEXT_FIELDS = ("ids", "attention_mask", "type_ids")
NUMERIC_DTYPES = ("float32", "float16", "float64", "int64", "int32", "uint8", "int8")


class RecipeError(ValueError):
    """The recipe is malformed, or one raw sample cannot be prepared by it; the message says which."""

    code = "invalid_dataset"


# Deeper than any recipe (the deepest is 3 levels); checked before json.loads, which recurses.
MAX_RECIPE_DEPTH = 8
_OBJECT_REPR = re.compile(r"<[^<>]*? (?:object )?at 0x[0-9a-fA-F]+>")


def library_message(error: BaseException) -> str:
    """A decoder's error without the `<_io.BytesIO object at 0x7f…>` it names the bytes by."""
    return _OBJECT_REPR.sub("the file", str(error))


def _json_nesting(text: str) -> int:
    """How deep brackets nest in JSON text (those inside strings do not count), without recursing."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


# -- checking a recipe --------------------------------------------------------------------------

def parse_recipe(raw: Any) -> dict[str, Any]:
    """The recipe with its defaults filled in; RecipeError says what is wrong."""
    if isinstance(raw, str):
        if _json_nesting(raw) > MAX_RECIPE_DEPTH:
            raise RecipeError(f"the recipe nests more than {MAX_RECIPE_DEPTH} levels deep")
        try:
            raw = json.loads(raw)
        except (json.JSONDecodeError, RecursionError) as error:
            raise RecipeError(f"the recipe is not JSON: {error}") from None
    if not isinstance(raw, dict) or raw.get("type") not in TYPES:
        raise RecipeError(f"a recipe is an object whose type is one of {', '.join(TYPES)}")
    parser = {"image": _image_recipe, "audio": _audio_recipe, "text": _text_recipe}[raw["type"]]
    recipe = parser(raw)
    if "outputs" in raw:
        recipe["outputs"] = parse_output_kinds(raw["outputs"])
    unknown = sorted(set(raw) - set(recipe))
    if unknown:
        raise RecipeError(f"unknown recipe field(s) for {raw['type']}: {', '.join(unknown)}")
    return recipe


# What a recipe may say of a model output: the post-processing the user really runs, as a kind and its options.
_OUTPUT_OPTIONS = {"threshold": (0.0, 1.0), "window": (1, 64), "min_region": (0.0, 0.5)}


def parse_output_kinds(raw: Any) -> dict[str, dict[str, Any]]:
    """A recipe's `outputs`: `{output name: {"kind": one of contract.OUTPUT_KINDS, "threshold", "window", "min_region"}}`
    (a heat map thresholded at 0.3 into text regions, a distribution decoded over 4 bins each side); it replaces the kind
    Kiln infers for that output."""
    from kiln_contract.contract import OUTPUT_KINDS

    if not isinstance(raw, dict) or len(raw) > 64:
        raise RecipeError('outputs must be an object like {"probabilities": {"kind": "heat_map", "threshold": 0.3}}')
    parsed: dict[str, dict[str, Any]] = {}
    for name, spec in raw.items():
        if not isinstance(name, str) or not name or len(name) > 200 or not isinstance(spec, dict):
            raise RecipeError("each entry of outputs is an output name with an object like {\"kind\": \"heat_map\"}")
        if spec.get("kind") not in OUTPUT_KINDS:
            raise RecipeError(f"outputs.{name}.kind must be one of {', '.join(OUTPUT_KINDS)}")
        unknown = sorted(set(spec) - {"kind", *_OUTPUT_OPTIONS})
        if unknown:
            raise RecipeError(f"outputs.{name} takes no {', '.join(unknown)}")
        entry: dict[str, Any] = {"kind": spec["kind"]}
        for option, (low, high) in _OUTPUT_OPTIONS.items():
            if option not in spec:
                continue
            value = spec[option]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high or value != value:
                raise RecipeError(f"outputs.{name}.{option} must be a number from {low} to {high}")
            entry[option] = int(value) if option == "window" else float(value)
        parsed[name] = entry
    return parsed


def _name(raw: dict, key: str, default: str) -> str:
    value = raw.get(key, default)
    if not isinstance(value, str) or not value or len(value) > 200:
        raise RecipeError(f"{key} must be a model input name")
    return value


def _dtype(raw: dict, default: str) -> str:
    value = raw.get("dtype", default)
    if value not in NUMERIC_DTYPES:
        raise RecipeError(f"dtype must be one of {', '.join(NUMERIC_DTYPES)}")
    return value


def _numbers(raw: dict, key: str, default: list[float], count: int) -> list[float]:
    value = raw.get(key, default)
    if isinstance(value, int | float):
        value = [value] * count
    if (not isinstance(value, list) or len(value) != count
            or not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in value)):
        raise RecipeError(f"{key} must be {count} number(s), one per channel")
    return [float(v) for v in value]


def _image_recipe(raw: dict) -> dict[str, Any]:
    size = raw.get("size")
    if (not isinstance(size, list) or len(size) != 2
            or not all(type(v) is int and 1 <= v <= MAX_IMAGE_SIDE for v in size)):
        raise RecipeError(f"size must be [height, width], each 1..{MAX_IMAGE_SIDE}")
    color = raw.get("color", "RGB")
    if color not in ("RGB", "BGR", "L"):
        raise RecipeError("color must be RGB, BGR or L (grayscale)")
    channels = 1 if color == "L" else 3
    resize = raw.get("resize", "stretch")
    if resize not in ("stretch", "shorter_side_crop"):
        raise RecipeError("resize must be stretch or shorter_side_crop")
    layout = raw.get("layout", "NCHW")
    if layout not in ("NCHW", "NHWC"):
        raise RecipeError("layout must be NCHW or NHWC")
    scale = _scale(raw.get("scale", 1 / 255))
    std = _numbers(raw, "std", [1.0] * channels, channels)
    if any(value == 0 for value in std):
        raise RecipeError("std must not be zero")
    return {"type": "image", "input": _name(raw, "input", "images"), "size": size, "resize": resize, "color": color,
            "scale": scale, "mean": _numbers(raw, "mean", [0.0] * channels, channels), "std": std,
            "layout": layout, "dtype": _dtype(raw, "float32")}


def _scale(value: Any) -> float:
    """A number, or a fraction as people write it ("1/255", which JSON cannot hold exactly)."""
    if isinstance(value, str):
        numerator, slash, denominator = value.partition("/")
        try:
            value = float(numerator) / float(denominator) if slash else float(numerator)
        except (ValueError, ZeroDivisionError):
            raise RecipeError(f"scale must be a number or a fraction such as \"1/255\", not {value[:40]!r}") from None
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise RecipeError("scale must be a number or a fraction such as \"1/255\"")
    return float(value)


def _audio_recipe(raw: dict) -> dict[str, Any]:
    rate = raw.get("sample_rate")
    if type(rate) is not int or not 1000 <= rate <= 192000:
        raise RecipeError("sample_rate must be a whole number of Hz from 1000 to 192000")
    length = raw.get("length")
    if length is not None and (type(length) is not int or not 1 <= length <= rate * MAX_AUDIO_SECONDS):
        raise RecipeError(f"length must be a number of samples, at most {MAX_AUDIO_SECONDS} s")
    if not isinstance(raw.get("resample", False), bool) or not isinstance(raw.get("batch_axis", True), bool):
        raise RecipeError("resample and batch_axis must be true or false")
    chunk, context = raw.get("chunk"), raw.get("context", 0)
    if chunk is not None and (type(chunk) is not int or not 1 <= chunk <= rate * 60):
        raise RecipeError("chunk must be a number of samples per call, at most a minute")
    if type(context) is not int or not 0 <= context <= rate * 60 or (context and chunk is None):
        raise RecipeError("context is a number of earlier samples fed with each chunk (needs chunk)")
    constants = raw.get("constants", {})
    if (not isinstance(constants, dict) or len(constants) > 8
            or not all(isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for k, v in constants.items())):
        raise RecipeError("constants maps input names to numbers fed with every call")
    return {"type": "audio", "input": _name(raw, "input", "input"), "sample_rate": rate, "resample": raw.get("resample", False),
            "length": length, "dtype": _dtype(raw, "float32"), "chunk": chunk, "context": context,
            "batch_axis": raw.get("batch_axis", True), "constants": dict(constants)}


def _text_recipe(raw: dict) -> dict[str, Any]:
    inputs = raw.get("inputs", {"input_ids": "ids", "attention_mask": "attention_mask"})
    if not isinstance(inputs, dict) or not inputs or len(inputs) > 8 or not all(isinstance(k, str) and k for k in inputs):
        raise RecipeError(f"inputs must map model input names to one of {', '.join(TEXT_FIELDS)}")
    length = raw.get("max_length")
    if type(length) is not int or not 1 <= length <= MAX_TEXT_LENGTH:
        raise RecipeError(f"max_length must be a whole number of tokens, 1..{MAX_TEXT_LENGTH}")
    return {"type": "text", "inputs": {name: _text_input(name, spec, length) for name, spec in inputs.items()},
            "max_length": length, "dtype": _dtype(raw, "int64")}


def _text_input(name: str, spec: Any, length: int) -> str | dict[str, Any]:
    """One text input: a token field's name, or an object that gives it its own dtype, shape or additive form."""
    if isinstance(spec, str) and spec in TEXT_FIELDS:
        return spec
    if not isinstance(spec, dict) or spec.get("field") not in TEXT_FIELDS:
        raise RecipeError(f"input {name!r} must be one of {', '.join(TEXT_FIELDS)}, or an object with a field")
    unknown = sorted(set(spec) - {"field", "dtype", "shape", "additive"})
    if unknown:
        raise RecipeError(f"unknown field(s) for text input {name!r}: {', '.join(unknown)}")
    parsed: dict[str, Any] = {"field": spec["field"]}
    if "dtype" in spec:
        parsed["dtype"] = _dtype(spec, "int64")
    if "shape" in spec:
        shape = spec["shape"]
        if (not isinstance(shape, list) or not 1 <= len(shape) <= 6 or not all(type(v) is int and v >= 1 for v in shape)
                or math.prod(shape) != length):
            raise RecipeError(f"shape of input {name!r} must be whole numbers whose product is max_length ({length})")
        parsed["shape"] = shape
    if "additive" in spec:
        additive = spec["additive"]
        if spec["field"] != "attention_mask" or not isinstance(additive, int | float) or isinstance(additive, bool) or not math.isfinite(additive):
            raise RecipeError(f"additive of input {name!r} is the number fed on padding in place of an attention_mask's 0")
        parsed["additive"] = float(additive)
        # A bias is a float whatever the token arrays' dtype is.
        parsed.setdefault("dtype", "float32")
    return parsed


def text_field(spec: str | dict[str, Any]) -> str:
    """The token field (ids, attention_mask, type_ids) a text input is made from."""
    return spec if isinstance(spec, str) else spec["field"]


def recipe_inputs(recipe: dict[str, Any]) -> list[str]:
    """The model inputs a recipe makes."""
    if recipe["type"] == "text":
        return list(recipe["inputs"])
    return [recipe["input"], *recipe.get("constants", {})]


# -- preparing one sample -----------------------------------------------------------------------

def prepare_image(data: bytes, recipe: dict[str, Any]) -> np.ndarray:
    """One image file's bytes as the input tensor (no batch axis)."""
    return normalize_image(decode_image(data, recipe), recipe)


def decode_image(data: bytes, recipe: dict[str, Any]):
    """The image resized and cropped to the recipe's size, in its colour mode (a Pillow image)."""
    from PIL import Image, UnidentifiedImageError

    try:
        # Opening reads the header only; the declared size is checked before a pixel is decoded.
        with Image.open(io.BytesIO(data)) as opened:
            width, height = opened.size
            if max(width, height) > 4 * MAX_IMAGE_SIDE or width * height > MAX_IMAGE_PIXELS:
                raise RecipeError(f"the image declares {width}x{height} pixels, over this server's limit of {4 * MAX_IMAGE_SIDE} "
                                  f"a side and {MAX_IMAGE_PIXELS:,} in all")
            image = opened.convert("L" if recipe["color"] == "L" else "RGB")
    except Image.DecompressionBombError as error:
        raise RecipeError(f"the image declares too many pixels to decode ({library_message(error)})") from None
    except UnidentifiedImageError:
        raise RecipeError("not an image Pillow can read (not a JPEG or PNG it recognises)") from None
    except (OSError, SyntaxError, ValueError) as error:
        raise RecipeError(f"not an image Pillow can read ({library_message(error)})") from None
    height, width = recipe["size"]
    if recipe["resize"] == "shorter_side_crop":
        factor = max(height / image.height, width / image.width)
        resized = image.resize((max(width, round(image.width * factor)), max(height, round(image.height * factor))), Image.BILINEAR)
        left, top = (resized.width - width) // 2, (resized.height - height) // 2
        return resized.crop((left, top, left + width, top + height))
    return image.resize((width, height), Image.BILINEAR)


def normalize_image(image, recipe: dict[str, Any]) -> np.ndarray:
    array = np.asarray(image, dtype=np.float32)
    if array.ndim == 2:
        array = array[:, :, None]
    if recipe["color"] == "BGR":
        array = array[:, :, ::-1]
    array = (array * recipe["scale"] - np.asarray(recipe["mean"], np.float32)) / np.asarray(recipe["std"], np.float32)
    if recipe["layout"] == "NCHW":
        array = array.transpose(2, 0, 1)
    return np.ascontiguousarray(array.astype(recipe["dtype"]))


def prepare_audio(data: bytes, recipe: dict[str, Any]) -> np.ndarray:
    """One WAV file's bytes as a mono waveform at the recipe's rate, padded or cut to its length."""
    import soundfile

    check_wav_header(data)
    try:
        waveform, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (RuntimeError, soundfile.LibsndfileError, ValueError) as error:
        raise RecipeError(f"not a sound file soundfile can read ({library_message(error)})") from None
    if len(waveform) > rate * MAX_AUDIO_SECONDS:
        raise RecipeError(f"the recording is longer than {MAX_AUDIO_SECONDS} s")
    mono = waveform.mean(axis=1)
    if rate != recipe["sample_rate"]:
        if not recipe["resample"]:
            raise RecipeError(f"recorded at {rate} Hz but the recipe takes {recipe['sample_rate']} Hz "
                              "(set resample: true to convert)")
        from scipy.signal import resample_poly

        divisor = math.gcd(rate, recipe["sample_rate"])
        mono = resample_poly(mono, recipe["sample_rate"] // divisor, rate // divisor).astype(np.float32)
    length = recipe["length"]
    if length is not None:
        mono = mono[:length] if len(mono) >= length else np.pad(mono, (0, length - len(mono)))
    return np.ascontiguousarray(mono.astype(recipe["dtype"]))


# Sample widths per WAV encoding (fmt chunk's format code) that decode faithfully: PCM, IEEE float,
# A-law, mu-law; WAVE_FORMAT_EXTENSIBLE names PCM or float in its sub-format.
WAV_PCM, WAV_FLOAT, WAV_ALAW, WAV_MULAW, WAV_EXTENSIBLE = 1, 3, 6, 7, 0xFFFE
WAV_SAMPLE_BITS = {WAV_PCM: (8, 16, 24, 32), WAV_FLOAT: (32, 64), WAV_ALAW: (8,), WAV_MULAW: (8,)}
MAX_WAV_CHANNELS = 64
MAX_WAV_RATE = 768_000


def check_wav_header(data: bytes) -> None:
    """Refuse a WAV whose header is impossible or promises more than the file holds, before a decoder
    trusts it: the RIFF/WAVE magic, a fmt chunk with a known encoding, a sample width that encoding has,
    a block size that matches, and a data chunk no longer than the bytes after it."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise RecipeError("not a WAV file (no RIFF/WAVE header)")
    offset, encoding = 12, None
    while offset + 8 <= len(data):
        chunk, size = data[offset : offset + 4], int.from_bytes(data[offset + 4 : offset + 8], "little")
        body = offset + 8
        if chunk == b"fmt ":
            if size < 16 or size > len(data) - body:
                raise RecipeError("the WAV's format chunk is truncated")
            encoding = _wav_format(data[body : body + size])
        elif chunk == b"data":
            if encoding is None:
                raise RecipeError("the WAV has no format chunk before its samples")
            if size > len(data) - body:
                raise RecipeError(f"the WAV declares {size:,} bytes of samples but holds {len(data) - body:,}")
            return
        offset = body + size + (size & 1)
    raise RecipeError("the WAV has no data chunk")


def _wav_format(fmt: bytes) -> int:
    code, channels, rate, _, block_align, bits = struct.unpack_from("<HHIIHH", fmt)
    if code == WAV_EXTENSIBLE:
        if len(fmt) < 40:
            raise RecipeError("the WAV's extensible format chunk is truncated")
        code = struct.unpack_from("<H", fmt, 24)[0]
    if code not in WAV_SAMPLE_BITS:
        raise RecipeError(f"the WAV is encoded as format 0x{code:04x}; use PCM or float samples")
    if bits not in WAV_SAMPLE_BITS[code]:
        widths = ", ".join(map(str, WAV_SAMPLE_BITS[code]))
        raise RecipeError(f"the WAV declares {bits}-bit samples; this encoding has {widths}-bit samples")
    if not 1 <= channels <= MAX_WAV_CHANNELS or not 1 <= rate <= MAX_WAV_RATE:
        raise RecipeError(f"the WAV declares {channels} channels at {rate} Hz; at most {MAX_WAV_CHANNELS} channels and {MAX_WAV_RATE} Hz")
    if block_align != channels * bits // 8:
        raise RecipeError(f"the WAV's block size ({block_align} bytes) does not match {channels} channels of {bits}-bit samples")
    return code


def audio_tensors(waveform: np.ndarray, recipe: dict[str, Any]) -> dict[str, np.ndarray]:
    """A waveform as the recipe's input (whole, or a sequence of chunks with their context) and constants."""
    chunk = recipe.get("chunk")
    constants = recipe.get("constants") or {}
    if not chunk:
        return {recipe["input"]: waveform, **{name: _constant(value) for name, value in constants.items()}}
    steps = max(1, math.ceil(len(waveform) / chunk))
    context = recipe.get("context", 0)
    padded = np.pad(waveform, (context, steps * chunk - len(waveform)))
    calls = np.stack([padded[step * chunk : step * chunk + context + chunk] for step in range(steps)])
    if recipe.get("batch_axis", True):
        calls = calls[:, None, :]
    return {recipe["input"]: np.ascontiguousarray(calls),
            **{name: np.full(steps, _constant(value)) for name, value in constants.items()}}


def _constant(value: float) -> np.ndarray:
    return np.asarray(value, dtype=np.int64 if isinstance(value, int) else np.float32)


def load_tokenizer(tokenizer_json: str, recipe: dict[str, Any]):
    """A `tokenizers` tokenizer from a tokenizer.json, padding and cutting to the recipe's length."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_str(tokenizer_json)
    except Exception as error:  # the Rust side raises plain Exception for a bad file
        raise RecipeError(f"not a tokenizer.json the tokenizers library can read ({library_message(error)})") from None
    tokenizer.enable_truncation(max_length=recipe["max_length"])
    tokenizer.enable_padding(length=recipe["max_length"])
    return tokenizer


def prepare_text(line: str, recipe: dict[str, Any], tokenizer) -> dict[str, np.ndarray]:
    """One line of text as the recipe's token arrays (no batch axis)."""
    encoding = tokenizer.encode(line)
    return {name: _text_tensor(encoding, spec, recipe["dtype"]) for name, spec in recipe["inputs"].items()}


def _text_tensor(encoding, spec: str | dict[str, Any], dtype: str) -> np.ndarray:
    values = np.asarray(getattr(encoding, text_field(spec)))
    if isinstance(spec, str):
        return values.astype(dtype)
    if "additive" in spec:
        values = np.where(values != 0, 0.0, spec["additive"])
    values = values.astype(spec.get("dtype", dtype))
    return np.ascontiguousarray(values.reshape(spec["shape"])) if "shape" in spec else values


def prepare_file(name: str, data: bytes, recipe: dict[str, Any]) -> dict[str, np.ndarray]:
    """The input tensors of one image or audio file; RecipeError names the file."""
    try:
        if recipe["type"] == "image":
            return {recipe["input"]: prepare_image(data, recipe)}
        if recipe["type"] == "audio":
            return audio_tensors(prepare_audio(data, recipe), recipe)
    except RecipeError as error:
        raise RecipeError(f"{name}: {error}") from None
    raise RecipeError(f"{name}: a {recipe['type']} recipe reads lines of text, not files")


def raw_members(names: list[str], recipe: dict[str, Any]) -> list[str]:
    """The files of a zip a recipe reads, in order (folders, hidden files and other types skipped)."""
    suffixes = IMAGE_SUFFIXES if recipe["type"] == "image" else AUDIO_SUFFIXES
    return sorted(name for name in names
                  if name.lower().endswith(suffixes) and not any(part.startswith((".", "__MACOSX")) for part in name.split("/")))


def member_label(name: str) -> str | None:
    """The class of a file from its folder (`cat/001.jpg` is a cat), or None at the top level."""
    parts = name.split("/")
    return parts[-2] if len(parts) > 1 else None
