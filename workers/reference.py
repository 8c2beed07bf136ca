"""Compute the FP32 reference outputs that every device variant is compared against."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from devices.backends.onnxruntime import ort_dtype
from kiln_contract import feeds
from kiln_contract.batching import sample_rows
from workers.datasets import dataset_samples, iter_batches
from workers.inspect import infer_output_kinds


def compute_reference_outputs(
    model_path: str | Path, dataset_path: str | Path, out_path: str | Path, *, batch_size: int = 32,
    plan: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the FP32 model on CPU over a validation set and write its outputs, by output name, to an .npz.

    With a feed `plan` (kiln_contract/feeds.py) that is not plain batch-first, every sample is fed as
    its exact tensors, sequences call by call with state carried, and the outputs are stacked
    call by call. Outputs are gathered in memory before writing, so they (not the inputs) bound
    memory use.
    """
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    input_names = [model_input.name for model_input in session.get_inputs()]
    output_names = [model_output.name for model_output in session.get_outputs()]
    if feeds.needs_calls(plan):
        return _reference_by_calls(session, dataset_path, Path(out_path), plan, input_names, output_names)
    static_batch = static_batch_size(session)
    run_batch = static_batch or batch_size
    samples = dataset_samples(dataset_path)

    collected: dict[str, list[np.ndarray]] = {name: [] for name in output_names}
    for batch in iter_batches(dataset_path, input_names=input_names, batch_size=run_batch):
        rows = len(next(iter(batch.values())))
        padded = _pad_to(batch, static_batch) if static_batch else batch
        fed = len(next(iter(padded.values())))
        for name, value in zip(output_names, session.run(output_names, padded)):
            try:
                collected[name].append(sample_rows(value, batch_size=fed, rows=rows))
            except ValueError as error:
                raise ValueError(f"output {name!r}: {error}") from None

    outputs = {name: np.concatenate(parts) for name, parts in collected.items()}
    _write_npz_atomically(Path(out_path), outputs)
    return {"samples": samples, "outputs": {name: list(value.shape) for name, value in outputs.items()}}


def session_runner(session, output_names: list[str]):
    """A feeds -> {output name: value} callable over an onnxruntime session."""
    return lambda fed: dict(zip(output_names, session.run(output_names, fed)))


def _reference_by_calls(session, dataset_path, out_path: Path, plan, input_names, output_names) -> dict[str, Any]:
    dtypes = {spec.name: ort_dtype(spec.type) for spec in session.get_inputs()}
    stack = feeds.OutputStack(output_names)
    run = session_runner(session, output_names)
    samples = 0
    for sample, step, _, outputs in feeds.iter_calls(run, dataset_path, plan, input_names=input_names, dtypes=dtypes):
        stack.add(sample, step, outputs)
        samples = sample + 1
    outputs = stack.arrays()
    _write_npz_atomically(out_path, outputs)
    return {"samples": samples, "calls": len(stack.steps), "outputs": {name: list(value.shape) for name, value in outputs.items()}}


def static_batch_size(session) -> int | None:
    """Return the batch size the model insists on (an integer first dim on an input), or None if free."""
    for model_input in session.get_inputs():
        shape = model_input.shape
        if shape and isinstance(shape[0], int) and shape[0] > 0:
            return shape[0]
    return None


def _pad_to(batch: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
    # A static-batch model cannot take the short last batch; repeat its last sample and drop the extras later.
    padded = {}
    for name, value in batch.items():
        missing = size - len(value)
        padded[name] = np.concatenate([value, np.repeat(value[-1:], missing, axis=0)]) if missing > 0 else value
    return padded


def _write_npz_atomically(path: Path, arrays: dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # A retried task must never leave a half-written reference behind for a reader to trust.
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            np.savez(handle, **arrays)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


REFERENCE_FILE = "reference.npz"


def reference_command(request: dict, work: Path) -> dict[str, Any]:
    """The sandbox's `reference.compute` command: the FP32 outputs (left as `reference.npz` in its folder) and the
    kinds of outputs they show (workers.inspect.infer_output_kinds), both read from the user's model and data."""
    out = work / REFERENCE_FILE
    summary = compute_reference_outputs(request["model"], request["inputs"], out, plan=request.get("feeds"))
    with np.load(out, allow_pickle=False) as archive:
        reference = {name: archive[name] for name in archive.files}
    return {"summary": summary, "output_kinds": infer_output_kinds(request["model"], reference)}
