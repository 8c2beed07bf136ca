"""The dataset parsing the sandbox runs: numpy's readers, h5py, Pillow, soundfile and tokenizers on a user's upload.

Each command is called by workers/sandbox/child.py, already confined, with the upload shared read-only;
what it writes lands in its own folder and the caller takes it from there (runner `outputs`). The
web process only reads the JSON answer.
"""
from __future__ import annotations

from pathlib import Path

from .datasets import hdf5_to_samples, inspect_dataset
from .raw_datasets import build_raw_dataset, preview_raw_dataset

HDF5_SAMPLES = "samples.zip"
RAW_PREPARED = "prepared.npz"


def inspect(request: dict, work: Path) -> dict:
    return inspect_dataset(Path(request["path"]), display_name=request["display_name"], max_bytes=request.get("max_bytes"))


def hdf5(request: dict, work: Path) -> dict:
    samples = work / HDF5_SAMPLES
    hdf5_to_samples(Path(request["path"]), samples, display_name=request["display_name"], max_bytes=request.get("max_bytes"))
    return inspect_dataset(samples, display_name=request["display_name"], max_bytes=request.get("max_bytes"))


def raw(request: dict, work: Path) -> dict:
    return build_raw_dataset(Path(request["path"]), request["recipe"], work / RAW_PREPARED, display_name=request["display_name"],
                             tokenizer_json=request.get("tokenizer_json"), max_bytes=request.get("max_bytes"))


def preview(request: dict, work: Path) -> dict:
    return preview_raw_dataset(Path(request["path"]), request["recipe"], display_name=request["display_name"], names=request.get("names"))
