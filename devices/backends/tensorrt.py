"""TensorRT backend: a seam for the GPU work to come, not an implementation."""

from __future__ import annotations

from pathlib import Path

from devices.backends.base import Backend, CompiledModel

NOT_IMPLEMENTED = (
    "The TensorRT backend is not implemented yet: engine building (ONNX parser, builder config, "
    "serialized engine as artifact) belongs to the separate TensorRT backend issue. Until then "
    "run this agent with KILN_AGENT_BACKENDS=onnxruntime,openvino so that it is not sent "
    "TensorRT tasks."
)


class TensorRtBackend(Backend):
    """NVIDIA TensorRT; advertised only when `tensorrt` imports, but cannot compile yet."""

    name = "tensorrt"

    def available(self) -> bool:
        try:
            import tensorrt  # noqa: F401
        except Exception:
            return False
        return True

    def version(self) -> str | None:
        if not self.available():
            return None
        import tensorrt

        return getattr(tensorrt, "__version__", None)

    def compile(
        self, model_path: str | Path, work_dir: str | Path, *, threads: int | None = None,
        options: dict | None = None,
    ) -> CompiledModel:
        raise NotImplementedError(NOT_IMPLEMENTED)
