"""Inference runtimes behind one interface (see `base.Backend`)."""

from devices.backends.base import Backend, BackendUnavailable, CompiledModel, TensorSpec
from devices.backends.registry import available_backends, get_backend

__all__ = [
    "Backend",
    "BackendUnavailable",
    "CompiledModel",
    "TensorSpec",
    "available_backends",
    "get_backend",
]
