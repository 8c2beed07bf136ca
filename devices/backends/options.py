"""Compile options: settings that change how fast a runtime runs a model but not the graph's math.

The search measures them like variants (`workers.quantize.search`), the agent applies them when it
compiles a task (`devices.agent.runner`), and the package's `run.py` applies them again, so a user
gets the speed Kiln measured. One parser here keeps the three in agreement.

- `static_shapes`: `{input name: [dims]}`: specialise every dynamic dimension to the data's shape
  (OpenVINO `reshape`, ONNX Runtime free-dimension overrides).
- `threads`: intra-op threads (the device's physical or logical core count).
- `graph_optimization` (ONNX Runtime): `basic`, `extended` or `all` (ORT's default).
- `performance_hint` (OpenVINO): `LATENCY` (the default here) or `THROUGHPUT`.
- `inference_precision` (OpenVINO): `f32` (the default here) or `bf16`, only on CPUs with bf16 units
  (which CPUs: `workers.quantize.isa_families`).
"""

from __future__ import annotations

from typing import Any

MAX_THREADS = 1024
MAX_DIM = 1 << 20
MAX_INPUTS = 64
GRAPH_OPTIMIZATION_LEVELS = ("basic", "extended", "all")
PERFORMANCE_HINTS = ("LATENCY", "THROUGHPUT")
INFERENCE_PRECISIONS = ("f32", "bf16")


class InvalidCompileOptions(ValueError):
    """Compile options that no runtime could apply; the message says which key and why."""


def parse_compile_options(raw: Any) -> dict[str, Any]:
    """Checked, canonical compile options (unknown keys and out-of-range values raise)."""
    if raw in (None, {}):
        return {}
    if not isinstance(raw, dict):
        raise InvalidCompileOptions("compile options must be an object")
    known = {"static_shapes", "threads", "graph_optimization", "performance_hint", "inference_precision"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise InvalidCompileOptions(f"unknown compile option(s): {', '.join(map(str, unknown))}")
    options: dict[str, Any] = {}
    if raw.get("static_shapes") is not None:
        options["static_shapes"] = _static_shapes(raw["static_shapes"])
    if raw.get("threads") is not None:
        threads = raw["threads"]
        if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_THREADS:
            raise InvalidCompileOptions(f"threads must be an integer from 1 to {MAX_THREADS}")
        options["threads"] = threads
    for key, allowed in (("graph_optimization", GRAPH_OPTIMIZATION_LEVELS), ("performance_hint", PERFORMANCE_HINTS),
                         ("inference_precision", INFERENCE_PRECISIONS)):
        if raw.get(key) is not None:
            if raw[key] not in allowed:
                raise InvalidCompileOptions(f"{key} must be one of {', '.join(allowed)}")
            options[key] = raw[key]
    return options


def _static_shapes(raw: Any) -> dict[str, list[int]]:
    if not isinstance(raw, dict) or not raw or len(raw) > MAX_INPUTS:
        raise InvalidCompileOptions(f"static_shapes must map 1 to {MAX_INPUTS} input names to shapes")
    shapes = {}
    for name, dims in raw.items():
        if not isinstance(name, str) or not isinstance(dims, list) or len(dims) > 16:
            raise InvalidCompileOptions("static_shapes maps an input name to a list of at most 16 dimensions")
        if not all(isinstance(d, int) and not isinstance(d, bool) and 1 <= d <= MAX_DIM for d in dims):
            raise InvalidCompileOptions(f"static_shapes[{name!r}]: every dimension must be an integer from 1 to {MAX_DIM}")
        shapes[name] = list(dims)
    return shapes


def describe(options: dict[str, Any]) -> str:
    """A short human label: "static 1x1x64x160, 2 threads, ORT level extended"."""
    parts = []
    for name, dims in (options.get("static_shapes") or {}).items():
        parts.append(f"static {name} {'x'.join(map(str, dims))}")
    if options.get("threads"):
        parts.append(f"{options['threads']} thread{'s' if options['threads'] != 1 else ''}")
    if options.get("graph_optimization"):
        parts.append(f"ORT level {options['graph_optimization']}")
    if options.get("performance_hint"):
        parts.append(f"hint {options['performance_hint']}")
    if options.get("inference_precision"):
        parts.append(f"precision hint {options['inference_precision']}")
    return ", ".join(parts) or "runtime defaults"
