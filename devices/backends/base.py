"""The interface every inference runtime implements: compile an ONNX model, run it, profile it."""

from __future__ import annotations

import abc
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

PROFILE_TOP_NODES = 50


class BackendUnavailable(RuntimeError):
    """The requested runtime is unknown, not installed, or excluded by KILN_AGENT_BACKENDS."""


@dataclass(frozen=True)
class TensorSpec:
    """Name, numpy dtype and shape of a model input; None marks a dynamic dimension."""

    name: str
    dtype: np.dtype
    shape: tuple[int | None, ...]

    @property
    def static_batch(self) -> int | None:
        """The first dimension when it is fixed, else None."""
        if not self.shape:
            return None
        return self.shape[0]


class CompiledModel(abc.ABC):
    """A model compiled for one runtime, loaded and ready to run on this device."""

    artifact_path: Path
    threads: int
    input_specs: list[TensorSpec]
    output_names: list[str]
    # What the runtime computes the float (not quantized) operations in, when it says: "fp32", "bf16", "fp16".
    float_precision: str | None = None

    @property
    def input_names(self) -> list[str]:
        return [spec.name for spec in self.input_specs]

    @abc.abstractmethod
    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one inference and return every output by name."""

    @abc.abstractmethod
    def bind(self, feeds: dict[str, np.ndarray]) -> Callable[[], Any]:
        """Return a zero-argument callable that runs one inference on `feeds` as cheaply as the
        runtime allows; the benchmark's timing loop calls only this. The callable may share
        state with the model: it is valid until the next bind() or run()."""

    @abc.abstractmethod
    def profile(self, feeds: dict[str, np.ndarray], runs: int = 10, warmup_runs: int = 1) -> dict:
        """Per-op-type and per-node time, averaged over `runs` runs made after `warmup_runs` uncounted
        ones (see `summarize_profile`): a fresh session's first run pays for allocations and caches."""

    def close(self) -> None:
        """Release runtime resources; the object must not be used afterwards."""


class Backend(abc.ABC):
    """One inference runtime (ONNX Runtime, OpenVINO)."""

    name: str = ""

    @abc.abstractmethod
    def available(self) -> bool:
        """Whether the runtime can be imported and used on this machine."""

    @abc.abstractmethod
    def version(self) -> str | None:
        """The runtime's version, or None when it is not available."""

    @abc.abstractmethod
    def compile(
        self, model_path: str | Path, work_dir: str | Path, *, threads: int | None = None,
        options: dict[str, Any] | None = None,
    ) -> CompiledModel:
        """Compile `model_path` (ONNX) for this device, write the artifact under `work_dir`,
        and return the loaded model. `threads` None lets the runtime choose; `options` are
        compile options (`devices.backends.options`), whose `threads` wins over the argument."""

    def operator_support(self, model_path: Path) -> dict:
        """Which of the model's operators this runtime runs natively, which fall back and which it cannot run, from
        the runtime's own answer, in `kiln_contract.operator_support`'s shape. Ask through `devices.support.ask`, which turns this
        default (a backend with no way to ask) into an `unknown` answer."""
        raise NotImplementedError(f"the {self.name} backend cannot report operator support")


MAX_LAYERS_PER_NODE = 32
# Names OpenVINO makes up for nodes its transformations create (`Multiply_615451`): no model has them.
GENERATED_NAME = re.compile(r"^[A-Z][A-Za-z0-9]*_\d+$")
# Suffixes OpenVINO appends to a model node's name when it splits or wraps it.
RUNTIME_SUFFIX = re.compile(r"(/WithoutBiases|/fq_(weights|output|input)_\d+|/sink_port_\d+|_compressed)+$")


def model_layer_names(original_names: list[str]) -> list[str]:
    """The model's own node names among a runtime node's original names, suffixes and made-up names removed, in order."""
    names: list[str] = []
    for raw in original_names:
        name = RUNTIME_SUFFIX.sub("", raw.strip())
        if name and not GENERATED_NAME.match(name) and name not in names:
            names.append(name[:1000])
    return names


def summarize_profile(
    node_times_ms: dict[str, float], node_op_types: dict[str, str], runs: int, warmup_runs: int = 0,
    node_layers: dict[str, list[str]] | None = None,
) -> dict:
    """Turn total time per node over `runs` runs into the wire shape of a profile.

    Times are per run (total divided by `runs`); `share` is the fraction of all profiled time;
    `count` is how many nodes of that op type took time; `warmup_runs` says how many runs before
    them were left out. `node_layers` names, per runtime node, the model's own nodes it runs (a
    runtime fuses and renames: OpenVINO's `Multiply_615451` may be the model's `conv1` and `relu1`).
    """
    runs = max(int(runs), 1)
    total = sum(node_times_ms.values())
    by_type: dict[str, list] = {}
    for node, time_ms in node_times_ms.items():
        op_type = node_op_types.get(node, "unknown")
        entry = by_type.setdefault(op_type, [0.0, 0])
        entry[0] += time_ms
        entry[1] += 1

    def share(value: float) -> float:
        return value / total if total > 0 else 0.0

    by_op_type = [
        {"op_type": op_type, "time_ms": time_ms / runs, "share": share(time_ms), "count": count}
        for op_type, (time_ms, count) in by_type.items()
    ]
    by_op_type.sort(key=lambda row: row["time_ms"], reverse=True)
    by_node = [
        {"name": node, "op_type": node_op_types.get(node, "unknown"),
         "time_ms": time_ms / runs, "share": share(time_ms),
         **({"layers": node_layers[node][:MAX_LAYERS_PER_NODE]} if node_layers and node_layers.get(node) else {})}
        for node, time_ms in node_times_ms.items()
    ]
    by_node.sort(key=lambda row: row["time_ms"], reverse=True)
    return {
        "by_op_type": by_op_type,
        "by_node": by_node[:PROFILE_TOP_NODES],
        "runs": runs,
        "warmup_runs": max(int(warmup_runs), 0),
        "total_ms": total / runs,
    }
