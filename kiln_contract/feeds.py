"""How a dataset's samples become the calls a model is fed, the one rule the host's reference, the
host's calibration and the agent's evaluation all follow.

Two files hold samples: an `.npz` of named arrays (sample i is row i of every array) and a zip of
one `.npz` per sample (shapes may differ from sample to sample). Each input's layout is told apart
by rank, comparing a sample's array with the model input it feeds:

- one less than the input (offset 0, "batch-first"): the sample is fed as `row[None]`, so an
  `.npz` of such arrays can also be fed several samples per call;
- equal to the input (offset 1, "stacked feeds"): the sample is exactly the tensor fed, so
  scalars, inputs whose batch axis is not first and fixed-batch inputs all work;
- one more than the input (offset 2, "sequences"): the sample is a sequence of calls, step t fed
  `row[t]`; outputs named in the state mapping feed inputs on the next call, starting from the
  declared initial values.

Nothing here unpickles: a task file must never run code. Only numpy is imported at the top: a
deployment package carries this file as `kiln_feeds.py`, so that its `run.py` feeds raw samples and
carries state exactly as Kiln did.
"""

from __future__ import annotations

import io
import math
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

BATCH, CALLS, SEQUENCES = "batch", "calls", "sequences"
NPZ, SAMPLES = "npz", "samples"
LABELS = "labels"
# Initial state is sent as JSON in every task; keep it small.
MAX_INITIAL_ELEMENTS = 1 << 16
# Per-step figures in a report: the first steps are what a streaming model gets wrong first.
MAX_REPORTED_STEPS = 512


class FeedError(ValueError):
    """The data cannot be fed to the model as declared; the message says why, in the user's words."""


# -- the plan -----------------------------------------------------------------------------------

def file_format(path: str | Path) -> str:
    """`samples` for a zip of per-sample `.npz` files, `npz` for an `.npz` of arrays."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [name for name in archive.namelist() if not name.endswith("/")]
    except zipfile.BadZipFile as error:
        raise FeedError(f"{Path(path).name} is not a zip or .npz archive") from error
    return SAMPLES if names and all(name.endswith(".npz") for name in names) else NPZ


def _concrete_shape(shape: list | None) -> list[int]:
    return [dim if isinstance(dim, int) and dim > 0 else 1 for dim in (shape or [])]


def _shape_problems(name: str, fed: list, expected: list | None, *, first_axis: int = 0) -> list[str]:
    if expected is None:
        return []
    problems = []
    for axis, (have, want) in enumerate(zip(fed, expected[first_axis:]), start=first_axis):
        if isinstance(want, int) and want > 0 and isinstance(have, int) and have != want:
            problems.append(f"array {name!r} feeds size {have} on axis {axis} but the model input expects {want} "
                            f"(shape {format_shape(expected)})")
    return problems


def _initial_value(spec: dict[str, Any], value: Any) -> dict[str, Any]:
    shape = _concrete_shape(spec.get("shape"))
    dtype = np.dtype(spec["dtype"])
    try:
        array = np.asarray(0 if value is None else value, dtype=dtype)
    except (TypeError, ValueError) as error:
        raise FeedError(f"initial value of state input {spec['name']!r} is not a {dtype.name} number or nested list") from error
    if array.ndim:
        if array.ndim != len(shape) or _shape_problems(spec["name"], list(array.shape), spec.get("shape")):
            raise FeedError(f"initial value of state input {spec['name']!r} has shape {list(array.shape)}; "
                            f"the model input is {format_shape(spec.get('shape'))}")
        shape = list(array.shape)
    if math.prod(shape) > MAX_INITIAL_ELEMENTS:
        raise FeedError(f"state input {spec['name']!r} has {math.prod(shape)} elements, over {MAX_INITIAL_ELEMENTS}")
    return {"shape": shape, "dtype": dtype.name, "value": array.tolist()}


def resolve_plan(
    dataset: Mapping[str, Any], signature: Mapping[str, Any], *,
    state: Mapping[str, str] | None = None, initial_state: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """How to feed a dataset (`arrays` with dtype and shape, `format`) to a model signature.

    Returns `{"mode", "format", "offsets", "state", "initial"}`; raises FeedError listing every
    problem found. Stored shapes lead with the sample axis; a dimension that varies between
    samples is None.
    """
    plan, problems = plan_problems(dataset, signature, state=state, initial_state=initial_state)
    if problems:
        raise FeedError("; ".join(problems))
    return plan


def plan_problems(
    dataset: Mapping[str, Any], signature: Mapping[str, Any], *,
    state: Mapping[str, str] | None = None, initial_state: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """The plan of `resolve_plan` and, in words, every way the dataset does not fit (empty when it fits)."""
    arrays = dataset.get("arrays") or {}
    fmt = dataset.get("format") or NPZ
    inputs = {spec["name"]: spec for spec in signature.get("inputs", [])}
    outputs = {spec["name"]: spec for spec in signature.get("outputs", [])}
    state = dict(state or {})
    initial_state = dict(initial_state or {})
    problems: list[str] = []
    for output, fed in state.items():
        if output not in outputs:
            problems.append(f"the state mapping names output {output!r}, which the model does not have "
                            f"(outputs: {', '.join(map(repr, outputs)) or 'none'})")
        if fed not in inputs:
            problems.append(f"the state mapping feeds input {fed!r}, which the model does not have "
                            f"(inputs: {', '.join(map(repr, inputs)) or 'none'})")
        elif output in outputs and outputs[output].get("dtype") not in (None, inputs[fed]["dtype"]):
            problems.append(f"state output {output!r} is {outputs[output]['dtype']} but input {fed!r} is {inputs[fed]['dtype']}")
        elif output in outputs and not _state_shapes_fit(outputs[output].get("shape"), inputs[fed].get("shape")):
            problems.append(f"state output {output!r} has shape {format_shape(outputs[output]['shape'])} but input {fed!r} "
                            f"takes {format_shape(inputs[fed]['shape'])}")
    if len(set(state.values())) != len(state):
        problems.append("the state mapping feeds one input from two outputs")
    for name in initial_state:
        if name not in state.values():
            problems.append(f"an initial value is given for {name!r}, which the state mapping does not feed")
    state_inputs = set(state.values())
    offsets: dict[str, int] = {}
    for name, spec in inputs.items():
        if name in state_inputs:
            if name in arrays:
                problems.append(f"input {name!r} is fed from the state mapping; the dataset must not hold an array for it")
            continue
        if name not in arrays:
            problems.append(f"missing array for model input {name!r} ({spec['dtype']} {format_shape(spec.get('shape'))})")
            continue
        problems.extend(_array_problems(name, arrays[name], spec, offsets))
    for name in arrays:
        if name not in inputs and name != LABELS:
            expected = ", ".join(repr(n) for n in inputs) or "none"
            problems.append(f"array {name!r} matches no model input (model inputs: {expected})")
    mode = _mode(offsets, problems)
    if state and mode != SEQUENCES and not problems:
        problems.append("a state mapping needs a dataset of sequences: give every input array one more axis than the "
                        "model input (sequence, step, then the tensor fed), or one .npz per sequence with a leading step axis")
    initial = {}
    for fed in state.values():
        if fed in inputs:
            try:
                initial[fed] = _initial_value(inputs[fed], initial_state.get(fed))
            except FeedError as error:
                problems.append(str(error))
    return {"mode": mode, "format": fmt, "offsets": offsets, "state": state, "initial": initial}, problems


def _state_shapes_fit(produced: list | None, expected: list | None) -> bool:
    """Whether an output can be fed back as an input: the same rank, and no fixed size that differs
    (a symbolic or unknown size fits anything)."""
    if produced is None or expected is None:
        return True
    return len(produced) == len(expected) and all(
        not (isinstance(ours, int) and isinstance(theirs, int)) or ours == theirs for ours, theirs in zip(produced, expected, strict=True))


def _array_problems(name: str, array: Mapping[str, Any], spec: Mapping[str, Any], offsets: dict[str, int]) -> list[str]:
    problems = []
    if array["dtype"] != spec["dtype"]:
        problems.append(f"array {name!r} is {array['dtype']} but the model input expects {spec['dtype']}")
    expected = spec.get("shape")
    stored = list(array["shape"])
    if expected is None:
        offsets[name] = 1
        return problems
    offset = len(stored) - len(expected)
    # A scalar input has no batch axis to put samples on: it can only be stacked.
    if offset not in (0, 1, 2) or (offset == 0 and not expected):
        batch_first = f"{len(expected)} (batch-first, samples on the batch axis), " if expected else ""
        problems.append(
            f"array {name!r} has shape {format_shape(stored)} (rank {len(stored)}) but the model input expects rank "
            f"{len(expected)} {format_shape(expected)}: write rank {batch_first}"
            f"{len(expected) + 1} (one stacked feed per sample) or {len(expected) + 2} (sequences of feeds)"
        )
        return problems
    offsets[name] = offset
    # Batch-first arrays stand for the batch axis with their sample axis, which is never compared.
    fed = stored[1:] if offset == 0 else stored[offset:]
    problems.extend(_shape_problems(name, fed, expected, first_axis=1) if offset == 0 else _shape_problems(name, fed, expected))
    return problems


def _mode(offsets: Mapping[str, int], problems: list[str]) -> str:
    kinds = set(offsets.values())
    if 2 in kinds:
        if kinds != {2}:
            flat = ", ".join(repr(name) for name, offset in offsets.items() if offset != 2)
            problems.append(f"some arrays are sequences and some are not ({flat}); give every input a step axis")
        return SEQUENCES
    return CALLS if 1 in kinds else BATCH


def format_shape(shape: list | None) -> str:
    if shape is None:
        return "[any shape]"
    return "[" + ", ".join("?" if dim is None else str(dim) for dim in shape) + "]"


def needs_calls(plan: Mapping[str, Any] | None) -> bool:
    """Whether the plan must be fed sample by sample (not the classic batch-first `.npz`)."""
    return bool(plan) and (plan.get("mode") != BATCH or plan.get("format") == SAMPLES)


# -- reading samples ----------------------------------------------------------------------------

def iter_rows(path: str | Path, names: list[str], *, limit: int | None = None, indices: list[int] | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Yield one `{name: array}` per sample (row i of an `.npz`, or one member of a zip of samples).

    `indices` (sorted) picks samples; `limit` stops after that many. Memory holds one sample.
    """
    path = Path(path)
    wanted = None if indices is None else set(indices)
    rows = _npz_rows(path, names) if file_format(path) == NPZ else _sample_rows(path, names)
    served = 0
    for index, row in enumerate(rows):
        if limit is not None and served >= limit:
            return
        if wanted is not None and index not in wanted:
            continue
        served += 1
        yield row


def sample_count(path: str | Path) -> int:
    path = Path(path)
    if file_format(path) == SAMPLES:
        with zipfile.ZipFile(path) as archive:
            return len(_sample_members(archive))
    from kiln_contract import npzio

    with zipfile.ZipFile(path) as archive:
        lengths = {header.shape[0] for header in npzio.read_headers(archive).values() if header.shape}
    return min(lengths) if lengths else 0


def _npz_rows(path: Path, names: list[str]) -> Iterator[dict[str, np.ndarray]]:
    from kiln_contract import npzio

    with zipfile.ZipFile(path) as archive:
        headers = npzio.read_headers(archive)
        present = [name for name in names if name in headers]
        samples = min((headers[name].shape[0] for name in present), default=0)
        readers = {name: npzio.iter_rows(archive, headers[name], 1, samples) for name in present}
        for _ in range(samples):
            yield {name: next(reader)[0] for name, reader in readers.items()}


def _sample_members(archive: zipfile.ZipFile) -> list[str]:
    return sorted(name for name in archive.namelist() if name.endswith(".npz"))


def _sample_rows(path: Path, names: list[str]) -> Iterator[dict[str, np.ndarray]]:
    with zipfile.ZipFile(path) as archive:
        for member in _sample_members(archive):
            yield load_sample(archive, member, names)


def load_sample(archive: zipfile.ZipFile, member: str, names: list[str] | None = None) -> dict[str, np.ndarray]:
    """The arrays of one per-sample `.npz` inside a zip, read without unpickling."""
    try:
        with np.load(io.BytesIO(archive.read(member)), allow_pickle=False) as sample:
            return {name: sample[name] for name in sample.files if names is None or name in names}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
        raise FeedError(f"sample {member!r} is not an .npz of numeric arrays: {error}") from error


def sample_calls(row: Mapping[str, np.ndarray], plan: Mapping[str, Any]) -> list[dict[str, np.ndarray]]:
    """The feeds of one sample, one dict per call (several for a sequence); state inputs not included."""
    offsets = plan["offsets"]
    if plan["mode"] == SEQUENCES:
        lengths = {name: len(row[name]) for name in offsets}
        if len(set(lengths.values())) > 1:
            raise FeedError(f"sequence arrays disagree on the number of steps: {lengths}")
        steps = next(iter(lengths.values()), 0)
        return [{name: contiguous(row[name][step]) for name in offsets} for step in range(steps)]
    return [{name: contiguous(row[name][None] if offset == 0 else row[name]) for name, offset in offsets.items()}]


def contiguous(value, dtype=None) -> np.ndarray:
    """C-contiguous memory for a runtime, keeping a scalar a scalar (np.ascontiguousarray makes it 1-d)."""
    return np.asarray(value, dtype=dtype, order="C")


def initial_state(plan: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The state inputs' values for the first call of every sequence."""
    values = {}
    for name, spec in (plan.get("initial") or {}).items():
        array = np.asarray(spec["value"], dtype=spec["dtype"])
        values[name] = contiguous(np.broadcast_to(array, spec["shape"]) if array.ndim == 0 else array)
    return values


# -- running ------------------------------------------------------------------------------------

Runner = Callable[[dict[str, np.ndarray]], Mapping[str, np.ndarray]]


def iter_calls(run: Runner | None, path: str | Path, plan: Mapping[str, Any], *, input_names: list[str],
               limit: int | None = None, indices: list[int] | None = None, dtypes: Mapping[str, Any] | None = None,
               check: Callable[[], None] | None = None) -> Iterator[tuple[int, int, dict[str, np.ndarray], Mapping[str, np.ndarray] | None]]:
    """Yield `(sample, step, feeds with state, outputs)` for every call of every sample.

    With `run` None only the feeds are made (a model without state); with a state mapping the
    model must run, since each call's state comes from the previous call's outputs.
    """
    state_inputs = set((plan.get("state") or {}).values())
    data_names = [name for name in input_names if name not in state_inputs]
    for sample, row in enumerate(iter_rows(path, data_names, limit=limit, indices=indices)):
        if check is not None:
            check()
        for step, fed, outputs in run_calls(run, sample_calls(row, plan), plan, dtypes):
            yield sample, step, fed, outputs


def run_calls(run: Runner | None, calls: list[dict[str, np.ndarray]], plan: Mapping[str, Any],
              dtypes: Mapping[str, Any] | None = None) -> Iterator[tuple[int, dict[str, np.ndarray], Mapping[str, np.ndarray] | None]]:
    """Yield `(step, feeds with state, outputs)` for one sample's calls, each call's mapped outputs feeding the next."""
    mapping = plan.get("state") or {}
    if run is None:
        if mapping:
            raise FeedError("a stateful model must run to make its feeds")
        for step, feeds in enumerate(calls):
            yield step, feeds, None
        return
    state = initial_state(plan)
    for step, feeds in enumerate(calls):
        fed = {**feeds, **state}
        if dtypes:
            fed = {name: contiguous(value, dtypes.get(name, value.dtype)) for name, value in fed.items()}
        outputs = run(fed)
        missing = [output for output in mapping if output not in outputs]
        if missing:
            raise FeedError(f"the model returned no output {', '.join(map(repr, missing))} to carry as state")
        state = {name: contiguous(outputs[output], state[name].dtype) for output, name in mapping.items()}
        yield step, fed, outputs


class OutputStack:
    """Outputs of every call, stacked call by call, with the sample and step of each."""

    def __init__(self, names: list[str]):
        self.names = list(names)
        self.parts: dict[str, list[np.ndarray]] = {name: [] for name in self.names}
        self.samples: list[int] = []
        self.steps: list[int] = []

    def add(self, sample: int, step: int, outputs: Mapping[str, np.ndarray]) -> None:
        for name in self.names:
            value = np.asarray(outputs[name])
            if self.parts[name] and self.parts[name][0].shape != value.shape:
                raise FeedError(f"output {name!r} changes shape between calls ({list(self.parts[name][0].shape)} then "
                                f"{list(value.shape)}); outputs are compared call by call and must keep one shape")
            self.parts[name].append(value)
        self.samples.append(sample)
        self.steps.append(step)

    def arrays(self) -> dict[str, np.ndarray]:
        if not self.samples:
            raise FeedError("the dataset has no calls to run")
        return {name: np.stack(parts) for name, parts in self.parts.items()}


def per_step_figures(outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray], steps: list[int]) -> list[dict[str, Any]]:
    """Cosine and max abs error of each output at each step of the sequences, against the reference."""
    from kiln_contract.metrics import cosine_similarity, max_abs_error

    steps_array = np.asarray(steps)
    figures = []
    for step in range(min(int(steps_array.max(initial=-1)) + 1, MAX_REPORTED_STEPS)):
        rows = steps_array == step
        entry: dict[str, Any] = {"step": step, "sequences": int(rows.sum()), "outputs": {}}
        for name, expected in reference.items():
            if name not in outputs:
                continue
            ours, theirs = np.asarray(outputs[name])[rows], np.asarray(expected)[rows]
            entry["outputs"][name] = {"cosine": _finite(cosine_similarity(ours, theirs)),
                                      "max_abs_error": _finite(max_abs_error(ours, theirs))}
        figures.append(entry)
    return figures


def _finite(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None
