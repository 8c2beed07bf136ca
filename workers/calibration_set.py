"""The calibration calls of a job: which samples (count, seed, stratified by label) and the exact
tensors each call feeds, written once so every quantizer reads plain calls.

A stateful model's state inputs are part of what a quantizer must calibrate, and their values
exist only by running the FP32 model through each sequence; so the calls are materialized here,
as a zip of one `.npz` per call (which workers.datasets.iter_batches serves one call at a time).
"""

from __future__ import annotations

import io
import os
import tempfile
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from devices.backends.onnxruntime import ort_dtype
from kiln_contract import feeds
from workers.reference import session_runner

# Sample indices listed in a report; the seed and count reproduce the rest.
LISTED_INDICES = 64


def choose_samples(path: str | Path, *, count: int, seed: int, stratify: bool = True) -> dict[str, Any]:
    """Pick `count` sample indices with a seeded generator; with scalar labels, each label keeps its share.

    Returns `{"indices" (sorted), "count", "seed", "stratified", "by_label"}`.
    """
    total = feeds.sample_count(path)
    if not 1 <= count <= total:
        raise ValueError(f"cannot choose {count} of {total} samples")
    rng = np.random.default_rng(seed)
    labels = _scalar_labels(path) if stratify else None
    if labels is None:
        indices = np.sort(rng.choice(total, size=count, replace=False))
    else:
        indices = _stratified(labels, count, rng)
    by_label = dict(sorted(Counter(str(labels[i]) for i in indices).items())) if labels is not None else None
    return {"indices": [int(i) for i in indices], "count": count, "seed": seed, "stratified": labels is not None, "by_label": by_label}


def _scalar_labels(path: str | Path) -> np.ndarray | None:
    values = []
    for row in feeds.iter_rows(path, [feeds.LABELS]):
        label = row.get(feeds.LABELS)
        if label is None or np.asarray(label).size != 1 or np.asarray(label).dtype.kind not in "iub":
            return None
        values.append(np.asarray(label).reshape(()).item())
    return np.asarray(values) if values else None


def _stratified(labels: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """Largest-remainder shares per label, then a seeded draw inside each label."""
    classes, sizes = np.unique(labels, return_counts=True)
    exact = sizes * count / len(labels)
    shares = np.floor(exact).astype(int)
    for index in np.argsort(-(exact - shares), kind="stable")[: count - shares.sum()]:
        shares[index] += 1
    chosen = [rng.choice(np.flatnonzero(labels == label), size=share, replace=False)
              for label, share in zip(classes, shares) if share]
    return np.sort(np.concatenate(chosen))


def write_calibration_calls(model_path: str | Path, dataset_path: str | Path, plan: dict[str, Any], out_path: str | Path, *,
                            indices: list[int] | None = None) -> dict[str, Any]:
    """Write every call of the chosen samples, state inputs included, as a zip of one `.npz` per call."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    input_names = [spec.name for spec in session.get_inputs()]
    dtypes = {spec.name: ort_dtype(spec.type) for spec in session.get_inputs()}
    run = session_runner(session, [spec.name for spec in session.get_outputs()]) if plan.get("state") else None
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=out_path.parent, prefix=f".{out_path.name}.", suffix=".tmp")
    os.close(descriptor)
    calls = samples = 0
    try:
        with zipfile.ZipFile(temporary, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for sample, _, fed, _ in feeds.iter_calls(run, dataset_path, plan, input_names=input_names, indices=indices, dtypes=dtypes):
                buffer = io.BytesIO()
                np.savez(buffer, **{name: feeds.contiguous(value, dtypes[name]) for name, value in fed.items()})
                archive.writestr(f"call-{calls:08d}.npz", buffer.getvalue())
                calls += 1
                samples = sample + 1
        os.replace(temporary, out_path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    if not calls:
        raise ValueError("the calibration set has no calls to feed")
    return {"samples": samples, "calls": calls}


CALLS_FILE = "calibration-calls.zip"


def calibration_command(request: dict, work: Path) -> dict[str, Any]:
    """The sandbox's `calibration.calls` command: choose the samples (when the job asks for a subset) and write their
    calls (left as `calibration-calls.zip` in its folder), reading the user's dataset and running the user's model."""
    subset = request.get("subset")
    chosen = choose_samples(request["dataset"], **subset) if subset else None
    written = write_calibration_calls(request["model"], request["dataset"], request["feeds"], work / CALLS_FILE,
                                      indices=chosen["indices"] if chosen else None)
    return {"chosen": chosen, "written": written}
