"""A preprocessing recipe proposed from a model's own inputs and outputs, so that raw data needs no NumPy.

The proposal reads the signature (input name, rank, layout, size, dtype) and the output kinds (a classifier
gets the normalisation classifiers are usually trained with, a detector plain 0..1 pixels). Each choice comes
with its reason, so that the user can see what to change; the recipe itself is checked by
kiln_contract.recipes.parse_recipe like any other.
"""
from __future__ import annotations

from typing import Any

from kiln_contract.recipes import parse_recipe

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
DEFAULT_IMAGE_SIDE = 224
DEFAULT_SAMPLE_RATE = 16000
FLOAT_DTYPES = ("float32", "float16", "float64")
TEXT_INPUTS = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}


def _static(dim: Any) -> int | None:
    return dim if isinstance(dim, int) and dim > 0 else None


def _image_layout(shape: list) -> tuple[str, int] | None:
    """NCHW or NHWC and the channel count of a batch-first image input, or None."""
    if len(shape) != 4:
        return None
    if _static(shape[1]) in (1, 3):
        return "NCHW", shape[1]
    if _static(shape[3]) in (1, 3):
        return "NHWC", shape[3]
    return None


def _kinds(output_kinds: dict) -> set[str]:
    return {str((info or {}).get("kind")) for info in (output_kinds or {}).values() if (info or {}).get("kind")}


def _image_recipe(tensor: dict, layout: str, channels: int, kinds: set[str]) -> tuple[dict, list[str]]:
    shape = tensor["shape"]
    height, width = (shape[2], shape[3]) if layout == "NCHW" else (shape[1], shape[2])
    why = [f"input {tensor['name']!r} is {_shape_text(shape)}: {layout}, {channels} channel{'s' if channels > 1 else ''}"]
    size = [_static(height) or DEFAULT_IMAGE_SIDE, _static(width) or DEFAULT_IMAGE_SIDE]
    if not (_static(height) and _static(width)):
        why.append(f"its height and width are not fixed, so images are made {size[0]}×{size[1]} (change size if it was trained at another)")
    else:
        why.append(f"images are resized to its {size[0]}×{size[1]}")
    recipe: dict[str, Any] = {"type": "image", "input": tensor["name"], "size": size, "layout": layout, "color": "L" if channels == 1 else "RGB"}
    dtype = tensor.get("dtype") or "float32"
    if dtype not in FLOAT_DTYPES:
        recipe.update(dtype=dtype if dtype in ("uint8", "int8", "int32", "int64") else "uint8", scale=1.0)
        why.append(f"it takes {dtype}: raw pixel values 0..255, no scaling")
        return recipe, why
    recipe["dtype"] = dtype
    if "detection" in kinds:
        recipe.update(resize="stretch", scale=1 / 255)
        why.append("a detection head: pixels scaled to 0..1 without mean/std (as YOLO-style detectors take them), the whole image stretched")
    elif "class_scores" in kinds and channels == 3:
        recipe.update(resize="shorter_side_crop", scale=1 / 255, mean=IMAGENET_MEAN, std=IMAGENET_STD)
        why.append("a classifier on colour images: shorter side resized then centre-cropped, ImageNet mean/std (torchvision's convention)")
    else:
        recipe.update(resize="stretch", scale=1 / 255)
        why.append("pixels scaled to 0..1")
    return recipe, why


def _audio_recipe(tensor: dict) -> tuple[dict, list[str]]:
    length = _static(tensor["shape"][-1])
    recipe: dict[str, Any] = {"type": "audio", "input": tensor["name"], "sample_rate": DEFAULT_SAMPLE_RATE, "resample": True,
                              "dtype": tensor.get("dtype") or "float32"}
    why = [f"input {tensor['name']!r} is {_shape_text(tensor['shape'])}: a waveform; resampled to {DEFAULT_SAMPLE_RATE} Hz "
           "(change sample_rate if the model was trained at another)"]
    if length:
        recipe["length"] = length
        why.append(f"each recording padded or cut to its {length} samples")
    return recipe, why


def _text_recipe(inputs: list[dict]) -> tuple[dict, list[str]]:
    fed = {tensor["name"]: TEXT_INPUTS[tensor["name"]] for tensor in inputs if tensor["name"] in TEXT_INPUTS}
    length = next((_static(tensor["shape"][-1]) for tensor in inputs if tensor["name"] in fed and len(tensor["shape"]) >= 2), None)
    recipe = {"type": "text", "inputs": fed, "max_length": length or 128,
              "dtype": next((tensor.get("dtype") for tensor in inputs if tensor["name"] in fed), "int64")}
    why = [f"inputs {', '.join(repr(name) for name in fed)} are token arrays: a .txt of lines and the model's tokenizer.json",
           f"sequences padded or cut to {recipe['max_length']} tokens"]
    return recipe, why


def _shape_text(shape: list) -> str:
    return "[" + ", ".join(str(dim) for dim in shape) + "]"


def propose_recipe(*, signature: dict, output_kinds: dict) -> dict:
    """`{"recipe": {...} | None, "why": [reasons], "input": name}` for the model's first input raw data can feed."""
    inputs = (signature or {}).get("inputs") or []
    kinds = _kinds(output_kinds)
    if any(tensor["name"] in TEXT_INPUTS for tensor in inputs):
        recipe, why = _text_recipe(inputs)
    else:
        recipe, why = None, []
        for tensor in inputs:
            shape = tensor.get("shape") or []
            layout = _image_layout(shape)
            if layout:
                recipe, why = _image_recipe(tensor, *layout, kinds)
                break
            if len(shape) == 2 and (tensor.get("dtype") or "") in FLOAT_DTYPES and (_static(shape[1]) or 0) >= 400:
                recipe, why = _audio_recipe(tensor)
                break
    if recipe is None:
        described = ", ".join(f"{t['name']} {_shape_text(t.get('shape') or [])}" for t in inputs) or "none"
        return {"recipe": None, "input": None,
                "why": [f"no input looks like images, audio or token ids (inputs: {described}); upload an .npz of arrays named like the inputs"]}
    if len(inputs) > 1 and recipe["type"] != "text":
        why.append(f"the model has {len(inputs)} inputs; raw files feed only {recipe['input']!r}, so use an .npz for the others")
    return {"recipe": parse_recipe(recipe), "input": recipe.get("input"), "why": why}
