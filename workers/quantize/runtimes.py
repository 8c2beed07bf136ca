"""Which runtimes a planned variant can run on, from how it is built: nothing is built for a runtime no target has.

A LiteRT build (`runtime: litert`) is LiteRT's alone and an OpenVINO IR build (`runtime: openvino`)
OpenVINO's alone. An ONNX build runs on the ONNX runtimes, except static INT8: its QDQ file is made
for ONNX Runtime, and OpenVINO gets its own INT8 build instead (`workers.quantize.openvino_family`),
because OpenVINO reading a QDQ file can ruin a model that NNCF's OpenVINO path keeps (issue 24).
Pure planning: nothing here imports a runtime or a converter.
"""

from __future__ import annotations

from typing import Any

from workers.quantize import litert, nncf_openvino

# The runtimes that read an ONNX variant.
ONNX_RUNTIMES = ("onnxruntime", "openvino")
# Built in a runtime's own format: the runtimes that read it.
OWN_FORMAT_RUNTIMES = {litert.RUNTIME: (litert.RUNTIME,), nncf_openvino.RUNTIME: (nncf_openvino.RUNTIME,)}
# ONNX builds whose file is made for some ONNX runtimes only.
ONNX_READERS = {"int8": ("onnxruntime",)}


def spec_runtimes(spec: dict[str, Any]) -> tuple[str, ...]:
    """The runtimes a planned spec can run on, narrowed to the spec's own list when it has one (a planner may name
    every target backend for an ONNX recipe)."""
    readers = _readers(spec)
    return tuple(backend for backend in spec.get("backends") or readers if backend in readers)


def _readers(spec: dict[str, Any]) -> tuple[str, ...]:
    runtime = (spec.get("options") or {}).get("runtime")
    if runtime in OWN_FORMAT_RUNTIMES:
        return OWN_FORMAT_RUNTIMES[runtime]
    return ONNX_READERS.get(spec.get("precision", ""), ONNX_RUNTIMES)


def for_targets(specs: list[dict[str, Any]], backends: list[str] | set[str]) -> list[dict[str, Any]]:
    """Only the specs some target runtime can run, each on those runtimes only: nothing is built for a runtime no target has.

    A spec without a list of backends keeps none (it runs wherever its build loads) unless its build is made for
    fewer runtimes than every ONNX runtime: then it names them, so that a runtime which merely loads the file is not
    given it.
    """
    offered = set(backends)
    kept = []
    for spec in specs:
        runtimes = [backend for backend in spec_runtimes(spec) if backend in offered]
        if not runtimes:
            continue
        narrowed = bool(spec.get("backends")) or set(_readers(spec)) != set(ONNX_RUNTIMES)
        kept.append({**spec, "backends": runtimes} if narrowed else spec)
    return kept
