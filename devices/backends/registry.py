"""Which backends exist, which of them this agent offers, and lookup by name."""

from __future__ import annotations

import os

from devices.backends.base import Backend, BackendUnavailable

BACKENDS_ENV = "KILN_AGENT_BACKENDS"


def _all_backends() -> dict[str, Backend]:
    # Imported here so that a runtime's import cost is paid only when backends are asked for. TensorRT is
    # designed (docs/tensorrt.md) but has no backend until a GPU is reachable: none is offered here.
    from devices.backends.litert import LiteRtBackend
    from devices.backends.onnxruntime import OnnxRuntimeBackend
    from devices.backends.openvino import OpenVinoBackend

    return {backend.name: backend for backend in (OnnxRuntimeBackend(), OpenVinoBackend(), LiteRtBackend())}


def allowed_backend_names() -> set[str] | None:
    """The names in KILN_AGENT_BACKENDS (comma list), or None when it is unset or empty."""
    raw = os.environ.get(BACKENDS_ENV, "")
    names = {name.strip().lower() for name in raw.split(",") if name.strip()}
    return names or None


def available_backends() -> dict[str, Backend]:
    """Backends that import on this machine and are allowed by KILN_AGENT_BACKENDS."""
    allowed = allowed_backend_names()
    return {
        name: backend
        for name, backend in _all_backends().items()
        if (allowed is None or name in allowed) and backend.available()
    }


def get_backend(name: str) -> Backend:
    """The backend called `name`; raises BackendUnavailable when this agent cannot offer it."""
    backends = _all_backends()
    if name not in backends:
        raise BackendUnavailable(f"unknown backend {name!r}; known: {', '.join(sorted(backends))}")
    allowed = allowed_backend_names()
    if allowed is not None and name not in allowed:
        raise BackendUnavailable(f"backend {name!r} is excluded by {BACKENDS_ENV}={os.environ[BACKENDS_ENV]}")
    backend = backends[name]
    if not backend.available():
        raise BackendUnavailable(f"backend {name!r} is not installed on this agent")
    return backend
