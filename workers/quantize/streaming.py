"""Activation statistics streamed within the build memory budget: memory grows with the tensors, not samples x activations.

ONNX Runtime's calibrators keep what every sample produced until the end: its histogram calibrators every intermediate
tensor of every sample, and even its MinMax calibrator runs each calibration batch with a ReduceMin/ReduceMax pair on
every tensor, whose working set at batch 16 is 5.8 GB on a 97 MB ViT (1.1 GB at batch 1). `CalibMaxIntermediateOutputs`
does not help: in onnxruntime 1.32 it drops the collected outputs instead of folding them into the ranges. Here the
statistics come from two passes over augmented graphs, each streamed batch by batch:

1. `reduce`: every tensor's min and max (and min |x| where ORT's percentile needs it) and element count leave the
   graph as scalars (ReduceMin/ReduceMax/Size nodes placed right after the tensor's producer, so nothing stays alive
   for them). A one-sample probe measures the session's working set first, and the batch is what the budget allows.
2. `groups`, only for the methods that need histograms: tensors are exposed as outputs in groups that fit beside
   that working set, and each batch's values go into histograms of a range fixed by pass 1, so the counts add up
   exactly: the result is the one a single pass over every sample at once would give.

The budget is the build's (`KILN_BUILD_MEMORY_MB`, workers/host_memory.py). When even one sample does not fit,
`CalibrationMemoryError` says what the calibration needed and what budget would fit, before the watchdog has to stop it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import numpy as np
import onnx
import psutil

from workers.datasets import InvalidDataset, batch_rows, iter_batches
from workers.host_memory import BUILD_MEMORY_ENV, build_memory_mb

MB = 1024 * 1024
# The share of what the budget leaves (after this process as it stands) that the activations may take: the rest is
# slack for the allocator's rounding, ORT's arena growing in chunks, and the watchdog sampling ten times a second.
ACTIVATION_SHARE = 0.6
# Values are histogrammed this many at a time, so the float64 and index copies stay small whatever the tensor.
HISTOGRAM_CHUNK = 1 << 20
# Bytes per element of the temporaries of one histogram chunk (float64 values, int64 indices, a mask).
_CHUNK_BYTES_PER_ELEMENT = 24
_SUFFIXES = {"min": "ReduceMin", "max": "ReduceMax"}


class CalibrationError(ValueError):
    """The calibration data cannot give usable ranges; the message says why in a user's words."""


class CalibrationMemoryError(CalibrationError):
    """One calibration sample's activations do not fit in the build memory budget; the message says what would."""


@dataclass
class TensorStats:
    """One tensor over the calibration set: extremes (in the tensor's own dtype), min |x| if asked, elements per feed."""

    minimum: np.generic
    maximum: np.generic
    elements: int
    dtype: np.dtype
    abs_minimum: np.generic | None = None

    @property
    def bytes_per_feed(self) -> int:
        return self.elements * self.dtype.itemsize


def memory_allowance_bytes(budget_mb: int | None = None) -> int:
    """What the activations may take: a share of the build budget less what this process already holds."""

    budget = (budget_mb or build_memory_mb()) * MB
    return max(0, int((budget - psutil.Process().memory_info().rss) * ACTIVATION_SHARE))


class ActivationStream:
    """Streams activation statistics of `tensor_names` of a model over a calibration .npz, within the memory budget.

    `what` names the recipe in errors ("int8 calibration (minmax)"). `batch_size` is the most samples fed at once; the
    budget may allow fewer. A model with a fixed batch is fed that batch, and the last partial batch is left out.
    `threads` 0 is ONNX Runtime's default (every core), as its own calibrators run.
    """

    def __init__(self, model_path: str | Path, tensor_names: list[str], *, batch_size: int = 16, what: str = "calibration",
                 threads: int = 0, budget_mb: int | None = None):
        self.model_path = Path(model_path)
        self.names = list(dict.fromkeys(tensor_names))
        self.requested_batch = max(1, int(batch_size))
        self.what = what
        self.threads = threads
        self.budget_mb = budget_mb
        self.stats: dict[str, TensorStats] = {}
        self.working_set_bytes = 0
        self.samples_served = 0
        # How each pass was fed: (batch size, groups), for the recipe and the tests.
        self.plan: dict[str, object] = {}
        self._scratch: tempfile.TemporaryDirectory | None = None

    def __enter__(self) -> Self:
        self._scratch = tempfile.TemporaryDirectory(prefix="kiln-stream-")
        header = onnx.load(str(self.model_path), load_external_data=False)
        initializers = {tensor.name for tensor in header.graph.initializer}
        self.input_names = [value.name for value in header.graph.input if value.name not in initializers]
        first = header.graph.input[0].type.tensor_type.shape.dim if header.graph.input else []
        self.static_batch = int(first[0].dim_value) if first and first[0].HasField("dim_value") and first[0].dim_value > 0 else None
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._scratch is not None:
            self._scratch.cleanup()
        # What the passes freed goes back to the system before the quantizer, in this same process, needs its own.
        release_free_memory()

    # -- pass 1 -------------------------------------------------------------------------------------------------

    def reduce(self, calibration_path: str | Path, *, limit: int, absolute_minimum: bool = False) -> dict[str, TensorStats]:
        """Each tensor's extremes and size over `limit` samples, as scalars out of the graph (pass 1)."""

        limit = self._whole_batches(limit)
        session = self._session(self._reduction_model(absolute_minimum), "reduce")
        outputs = [f"{name}::kiln_{kind}" for name in self.names for kind in self._kinds(absolute_minimum)]
        probe_feed = self.static_batch or 1
        # Freed memory the allocator kept (from loading, pre-processing) would hide the run's growth: give it back first.
        release_free_memory()
        before = psutil.Process().memory_info().rss
        growth = []
        # One feed, then two where the batch is free: a run's peak does not grow quite in proportion to the batch (the
        # second sample costs more than the first), so the working set per feed is the larger of the two steps.
        for feeds in (1,) if self.static_batch else (1, 2):
            probe = next(self._feeds(calibration_path, batch_size=probe_feed * feeds, limit=min(limit, probe_feed * feeds)))
            with PeakRss() as peak:
                self._merge(dict(zip(outputs, session.run(outputs, probe))), absolute_minimum, fresh=not growth)
            growth.append(peak.bytes - before)
        steps = [growth[0], *(later - earlier for earlier, later in zip(growth, growth[1:]))]
        largest = max((stats.bytes_per_feed for stats in self.stats.values()), default=0)
        self.working_set_bytes = max(*steps, largest)
        batch = self._batch_for(self.working_set_bytes, pass_name="the reductions")
        self.plan["reduce_batch"] = batch
        served = 0
        for feed in self._feeds(calibration_path, batch_size=batch, limit=limit):
            self._merge(dict(zip(outputs, session.run(outputs, feed))), absolute_minimum, fresh=False)
            served += batch_rows(feed)
        self.samples_served = served
        del session
        release_free_memory()
        return self.stats

    @staticmethod
    def _kinds(absolute_minimum: bool) -> tuple[str, ...]:
        return ("min", "max", "size", "absmin") if absolute_minimum else ("min", "max", "size")

    def _merge(self, values: dict[str, np.ndarray], absolute_minimum: bool, *, fresh: bool) -> None:
        for name in self.names:
            low, high = values[f"{name}::kiln_min"], values[f"{name}::kiln_max"]
            elements = int(values[f"{name}::kiln_size"])
            if elements and not (np.isfinite(low).all() and np.isfinite(high).all()):
                raise CalibrationError(
                    f"the model produces NaN or Inf at tensor {name!r} on the calibration samples; the FP32 model itself "
                    "overflows on this data")
            low, high = (low.reshape(-1)[0], high.reshape(-1)[0]) if elements else (np.zeros((), low.dtype)[()],) * 2
            absmin = values[f"{name}::kiln_absmin"].reshape(-1)[0] if absolute_minimum and elements else None
            current = self.stats.get(name)
            if fresh or current is None:
                feed_elements = elements
                self.stats[name] = TensorStats(low, high, feed_elements, np.dtype(low.dtype), absmin)
                continue
            current.minimum, current.maximum = min(current.minimum, low), max(current.maximum, high)
            if absmin is not None:
                current.abs_minimum = absmin if current.abs_minimum is None else min(current.abs_minimum, absmin)

    def _reduction_model(self, absolute_minimum: bool) -> Path:
        model = onnx.load(str(self.model_path))
        flat = "kiln_stream_flat"
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([-1], dtype=np.int64), flat))
        wanted = set(self.names)

        def reductions(name: str) -> list[onnx.NodeProto]:
            nodes = []
            for kind, op in _SUFFIXES.items():
                kept = f"{name}::kiln_{kind}_kept"
                nodes += [onnx.helper.make_node(op, [name], [kept], keepdims=1),
                          onnx.helper.make_node("Reshape", [kept, flat], [f"{name}::kiln_{kind}"])]
            nodes.append(onnx.helper.make_node("Size", [name], [f"{name}::kiln_size"]))
            if absolute_minimum:
                magnitude = f"{name}::kiln_abs"
                nodes += [onnx.helper.make_node("Abs", [name], [magnitude]),
                          onnx.helper.make_node("ReduceMin", [magnitude], [f"{name}::kiln_absmin_kept"], keepdims=1),
                          onnx.helper.make_node("Reshape", [f"{name}::kiln_absmin_kept", flat], [f"{name}::kiln_absmin"])]
            return nodes

        # Each tensor is reduced right after it is made: ORT runs nodes in this order, so a tensor need not outlive its
        # own consumers for the reductions' sake.
        ordered: list[onnx.NodeProto] = [node for name in self.input_names if name in wanted for node in reductions(name)]
        for node in model.graph.node:
            ordered.append(node)
            ordered += [extra for output in node.output if output in wanted for extra in reductions(output)]
        del model.graph.node[:]
        model.graph.node.extend(ordered)
        for name in self.names:
            for kind in self._kinds(absolute_minimum):
                model.graph.output.append(onnx.ValueInfoProto(name=f"{name}::kiln_{kind}"))
        return self._save(model, "reduce.onnx")

    # -- pass 2 -------------------------------------------------------------------------------------------------

    def groups(self, calibration_path: str | Path, *, limit: int,
               units: list[list[str]] | None = None) -> Iterator[tuple[list[str], Iterator[tuple[int, dict[str, np.ndarray]]]]]:
        """Yield (tensor names, batches of {name: values}) per group of tensors that fits the budget (pass 2).

        `units` are tensors that must come in one group (a node's several activation inputs); overlapping units are
        one. Needs `reduce` first (it measures the sizes and the working set)."""
        if not self.stats:
            raise RuntimeError("reduce() must run before groups()")
        limit = self._whole_batches(limit)
        batch, groups = self._group_plan(units)
        self.plan.update({"histogram_batch": batch, "groups": len(groups)})
        for group in groups:
            yield group, self._exposed_batches(group, calibration_path, batch, limit)

    def _group_plan(self, units: list[list[str]] | None = None) -> tuple[int, list[list[str]]]:
        """(batch, groups): every tensor at once at the largest batch that fits, else one feed at a time in groups, each
        unit whole in one group."""
        sizes = {name: self.stats[name].bytes_per_feed for name in self.names}
        per_feed = self.working_set_bytes + sum(sizes.values())
        # The histograms' temporaries: one chunk of the largest tensor, as float64 values, int64 indices and a mask.
        reserve = _CHUNK_BYTES_PER_ELEMENT * min(HISTOGRAM_CHUNK, max((self.stats[name].elements for name in self.names), default=0))
        allowance = self._allowance() - reserve
        fitting = allowance // per_feed if per_feed else self.requested_batch
        if fitting >= 1:
            return self._batch_for(per_feed, pass_name="the histograms", reserve=reserve), [self.names]
        room = allowance - self.working_set_bytes
        groups: list[list[str]] = [[]]
        used = 0
        for unit in self._whole_units(units or []):
            size = sum(sizes[name] for name in unit)
            if size > room:
                part = f"tensor {unit[0]!r}" if len(unit) == 1 else f"tensors {', '.join(repr(name) for name in unit)} together"
                raise self._memory_error(self.working_set_bytes + size + reserve, part)
            if used + size > room and groups[-1]:
                groups.append([])
                used = 0
            groups[-1].extend(unit)
            used += size
        return self.static_batch or 1, groups

    def _whole_units(self, units: list[list[str]]) -> list[list[str]]:
        """Every streamed tensor in exactly one unit, in stream order: the given units merged where they share a tensor,
        each other tensor alone."""
        owner = {name: name for name in self.names}

        def root(name: str) -> str:
            while owner[name] != name:
                owner[name] = owner[owner[name]]
                name = owner[name]
            return name

        for unit in units:
            members = [name for name in unit if name in owner]
            for name in members[1:]:
                owner[root(name)] = root(members[0])
        merged: dict[str, list[str]] = {}
        for name in self.names:
            merged.setdefault(root(name), []).append(name)
        return list(merged.values())

    def _exposed_batches(self, group: list[str], calibration_path: str | Path, batch: int,
                         limit: int) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        model = onnx.load(str(self.model_path))
        inputs = set(self.input_names)
        outputs = [name for name in group if name not in inputs]
        expose_tensors(model, outputs)
        session = self._session(self._save(model, "exposed.onnx"), "exposed")
        del model
        for feed in self._feeds(calibration_path, batch_size=batch, limit=limit):
            values = dict(zip(outputs, session.run(outputs, feed))) if outputs else {}
            yield batch_rows(feed), {name: feed[name] if name in inputs else values[name] for name in group}

    # -- shared -------------------------------------------------------------------------------------------------

    def _allowance(self) -> int:
        return memory_allowance_bytes(self.budget_mb)

    def _batch_for(self, per_feed: int, *, pass_name: str, reserve: int = 0) -> int:
        """Samples per feed for a pass costing `per_feed` bytes per feed; CalibrationMemoryError when not even one fits."""
        allowance = self._allowance() - reserve
        fitting = allowance // per_feed if per_feed else self.requested_batch
        if fitting < 1:
            raise self._memory_error(per_feed + reserve, pass_name)
        if self.static_batch:
            return self.static_batch
        return int(min(fitting, self.requested_batch))

    def _memory_error(self, needed_bytes: int, part: str) -> CalibrationMemoryError:

        budget = self.budget_mb or build_memory_mb()
        held = psutil.Process().memory_info().rss
        # What a budget must be for this one feed to take no more than the activations' share of what is left.
        fits_mb = int(np.ceil((held + needed_bytes / ACTIVATION_SHARE) / MB / 256.0) * 256)
        return CalibrationMemoryError(
            f"{self.what} needs about {needed_bytes / MB:.0f} MB for {part} of one calibration sample, beside the "
            f"{held / MB:.0f} MB this build already holds (the model and its session); the build memory budget is "
            f"{budget} MB ({BUILD_MEMORY_ENV}). A budget of {fits_mb} MB would fit; fewer calibration samples would not "
            "help, since calibration streams them")

    def _whole_batches(self, limit: int) -> int:
        if not self.static_batch:
            return limit
        whole = limit - limit % self.static_batch
        if whole == 0:
            raise CalibrationError(f"the model takes batches of {self.static_batch}; the calibration set is smaller")
        return whole

    def _feeds(self, calibration_path: str | Path, *, batch_size: int, limit: int) -> Iterator[dict[str, np.ndarray]]:
        served = 0
        try:
            for batch in iter_batches(calibration_path, input_names=self.input_names, batch_size=batch_size, limit=limit):
                check_finite_inputs(batch, served)
                served += batch_rows(batch)
                yield batch
        except InvalidDataset as error:
            raise CalibrationError(f"calibration dataset unusable: {error}") from error

    def _session(self, path: Path, label: str):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        # Fusions would remove the very tensors being observed (ORT's calibrators run unoptimized graphs too).
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 3
        options.enable_mem_pattern = False
        options.enable_cpu_mem_arena = False
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def _save(self, model: onnx.ModelProto, name: str) -> Path:
        from workers.convert import save_model

        path = Path(self._scratch.name) / name
        path.with_name(path.name + ".data").unlink(missing_ok=True)
        save_model(model, path)
        return path


class PeakRss:
    """This process's peak resident memory over a block: the kernel's high-water mark, reset on entry (Linux's
    /proc/self/clear_refs), or else a sampler thread, which can miss a short peak."""

    def __enter__(self) -> Self:
        import threading

        self.bytes = 0
        self._kernel = _reset_high_water_mark()
        if not self._kernel:
            self._done = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:

        process = psutil.Process()
        while not self._done.wait(0.002):
            self.bytes = max(self.bytes, process.memory_info().rss)

    def __exit__(self, *exc_info: object) -> None:
        if self._kernel:
            self.bytes = _high_water_mark()
        else:
            self._done.set()
            self._thread.join()


def release_free_memory() -> None:
    """Return the C allocator's free memory to the system (glibc's malloc_trim), so that RSS is what is in use."""
    import contextlib
    import ctypes

    # Not glibc (musl, macOS): nothing to trim, and RSS is only less exact. The symbols this process already has, not
    # ctypes.util.find_library: that runs ldconfig, gcc and ld, each a vfork of this process, which shares its memory
    # until the exec (refused in the sandbox), so the sandbox's watch counted the build's memory twice and stopped it.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


def _reset_high_water_mark() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _high_water_mark() > 0
    except OSError:
        return False


def _high_water_mark() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def check_finite_inputs(batch: dict[str, np.ndarray], served: int) -> None:
    for name, value in batch.items():
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            rows = batch_rows(batch)
            bad = served + int(np.argmin(np.isfinite(value).reshape(rows, -1).all(axis=1))) if rows > 1 else served
            raise CalibrationError(
                f"calibration input {name!r} contains NaN or Inf (first at sample {bad}); "
                "clean the calibration set: ranges cannot be estimated from non-finite values")


def expose_tensors(model: onnx.ModelProto, names: list[str]) -> None:
    """Add `names` to the model's outputs (in place) so a session can return them."""
    existing = {value.name for value in model.graph.output}
    inputs = {value.name for value in model.graph.input}
    for name in names:
        if name not in existing and name not in inputs:
            model.graph.output.append(onnx.ValueInfoProto(name=name))
