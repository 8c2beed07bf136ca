"""Normalize an uploaded ONNX model: opset upgrade, shape inference, simplification, final check.

Every step works file to file inside a scratch folder next to the destination, so external-data
models keep their weights on disk (their relative `location`s stay valid inside that folder).
A step that raises is skipped with its reason recorded; the pipeline never dies on one step.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
from onnx import version_converter

from workers.inspect import default_opset, iter_tensors, load_graph_only

# Above this the single protobuf file risks the 2 GB protobuf limit, so weights go to a side file.
LARGE_MODEL_BYTES = 1_500_000_000
MIN_OPSET = 13
# Models up to this size get a numerical before/after probe of the simplification.
PROBE_MAX_BYTES = 256_000_000
_ORT_NUMPY_TYPES = {
    "tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
    "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int8)": "int8", "tensor(uint8)": "uint8",
    "tensor(bool)": "bool",
}

StepFunction = Callable[..., "str | None"]


def convert_model(src_path: str | Path, dst_path: str | Path, *, target_opset: int = 17) -> dict[str, Any]:
    """Convert `src_path` into a normalized model at `dst_path` and report what each step did."""
    src, dst = Path(src_path), Path(dst_path)
    dst.parent.mkdir(parents=True, exist_ok=True)
    steps: list[dict[str, Any]] = []
    # The scratch folder sits beside dst so that the final move of a large model stays on one disk.
    with tempfile.TemporaryDirectory(dir=dst.parent, prefix=".convert-") as scratch:
        work = Path(scratch)
        current = _stage_source(src, work)
        candidates: list[tuple[str, Path]] = [("the uploaded model", current)]
        pipeline: list[tuple[str, StepFunction]] = [
            ("opset_upgrade", upgrade_opset),
            ("shape_inference", _infer_shapes),
            ("simplify", _simplify),
        ]
        for index, (name, step) in enumerate(pipeline, start=1):
            output = work / f"step{index}-{name}.onnx"
            record = _run_step(name, step, current, output, target_opset=target_opset)
            steps.append(record)
            if record["status"] == "applied":
                current = output
                candidates.append((f"the {name} step", output))
        final, check_record = _check_with_fallback(candidates)
        steps.append(check_record)
        _write_final(final, dst)
    return {"steps": steps, "opset": default_opset(load_graph_only(dst))}


def _run_step(name: str, step: StepFunction, source: Path, output: Path, *, target_opset: int) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        skip_reason = step(source, output, target_opset=target_opset)
    except Exception as error:
        status, reason = "skipped", f"{name} failed: {type(error).__name__}: {error}".strip()
    else:
        status, reason = ("skipped", skip_reason) if skip_reason else ("applied", None)
    return {"name": name, "status": status, "reason": reason, "seconds": round(time.perf_counter() - started, 4)}


def upgrade_opset(source: Path, output: Path, *, target_opset: int) -> str | None:
    """Raise the default-domain opset to at least 13, since runtimes and quantizers assume it."""
    model = load_graph_only(source)
    current = default_opset(model)
    if current >= MIN_OPSET:
        return f"already at opset {current} (>= {MIN_OPSET})"
    # Weights stay as external references: the converter copies them through untouched.
    converted = version_converter.convert_version(model, max(target_opset, MIN_OPSET))
    onnx.save(converted, str(output))
    return None


def _infer_shapes(source: Path, output: Path, *, target_opset: int) -> str | None:
    """Annotate intermediate shapes; the path-based form avoids the 2 GB in-memory limit."""
    onnx.shape_inference.infer_shapes_path(str(source), str(output), check_type=True, strict_mode=True, data_prop=True)
    return None


def _simplify(source: Path, output: Path, *, target_opset: int) -> str | None:
    """Fold constants and fuse patterns with onnxslim, keeping the model's public signature."""
    import onnxslim

    model = onnx.load(str(source))
    before = _signature(model)
    slimmed = onnxslim.slim(model)
    if slimmed is None:
        return "onnxslim returned no model"
    if _signature(slimmed) != before:
        return "onnxslim changed the model's inputs or outputs; kept the unsimplified model"
    mismatch = _output_mismatch(onnx.load(str(source)), slimmed)
    if mismatch:
        return f"onnxslim changed the model's outputs ({mismatch}); kept the unsimplified model"
    save_model(slimmed, output)
    return None


def _output_mismatch(original: onnx.ModelProto, simplified: onnx.ModelProto) -> str | None:
    """Run both models on one probe input and describe any difference; None when they agree or can't be compared.

    Folding and fusions should be exact up to float rounding; a real difference means a bad rewrite.
    """
    if _tensor_bytes(original) > PROBE_MAX_BYTES:
        return None  # Two sessions over a huge model cost more than the check is worth.
    import numpy as np
    import onnxruntime as ort

    try:
        sessions = [
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            for model in (original, simplified)
        ]
        feeds = _probe_feeds(sessions[0])
        expected, actual = (session.run(None, feeds) for session in sessions)
    except Exception:
        return None
    for name, want, got in zip(
        (output.name for output in sessions[0].get_outputs()), expected, actual, strict=True
    ):
        want, got = np.asarray(want), np.asarray(got)
        if want.shape != got.shape:
            return f"output {name!r} shape {list(want.shape)} became {list(got.shape)}"
        if want.dtype.kind in "fc" and not np.allclose(want, got, rtol=1e-3, atol=1e-4, equal_nan=True):
            return f"output {name!r} differs by up to {float(np.nanmax(np.abs(want - got))):.3g}"
        if want.dtype.kind not in "fc" and not np.array_equal(want, got):
            return f"output {name!r} differs"
    return None


def _probe_feeds(session) -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    feeds = {}
    for model_input in session.get_inputs():
        # Symbolic dims become 1; integer inputs are zeros so that index-like inputs stay in range.
        shape = [dim if isinstance(dim, int) and dim > 0 else 1 for dim in model_input.shape]
        dtype = _ORT_NUMPY_TYPES.get(model_input.type)
        if dtype is None:
            raise ValueError(f"cannot probe input type {model_input.type}")
        if np.dtype(dtype).kind == "f":
            feeds[model_input.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[model_input.name] = np.zeros(shape, dtype=dtype)
    return feeds


def _check_with_fallback(candidates: list[tuple[str, Path]]) -> tuple[Path, dict[str, Any]]:
    """Check the newest model; if it fails, walk back to the last one that passes."""
    started = time.perf_counter()
    first_error: str | None = None
    for label, path in reversed(candidates):
        try:
            onnx.checker.check_model(str(path), full_check=False)
        except Exception as error:
            first_error = first_error or f"{type(error).__name__}: {error}"
            continue
        if first_error is None:
            status, reason = "applied", None
        else:
            status, reason = "failed", f"the converted model failed the check ({first_error}); kept {label}"
        return path, _record("check", status, reason, started)
    label, path = candidates[0]
    return path, _record("check", "failed", f"no version passes the check ({first_error}); kept {label} unchanged", started)


def _record(name: str, status: str, reason: str | None, started: float) -> dict[str, Any]:
    return {"name": name, "status": status, "reason": reason, "seconds": round(time.perf_counter() - started, 4)}


def _stage_source(src: Path, work: Path) -> Path:
    """Place the source model and its external-data files in the scratch folder without reading weights."""
    model = load_graph_only(src)
    staged = work / "source.onnx"
    locations = _external_locations(model)
    if not locations:
        shutil.copyfile(src, staged)
        return staged
    source_root = src.parent.resolve()
    for location in locations:
        data = (src.parent / location).resolve()
        if not data.is_relative_to(source_root) or not data.is_file():
            raise ValueError(f"external data {location!r} is missing or outside the model's folder")
        target = work / location
        target.parent.mkdir(parents=True, exist_ok=True)
        # A copy, not a hard link: onnx refuses multiply-linked data files as a possible link attack.
        shutil.copyfile(data, target)
    onnx.save(model, str(staged))
    return staged


def _write_final(final: Path, dst: Path) -> None:
    """Write the chosen model to dst: one file when small, weights in `<dst>.data` when large."""
    side_file = dst.with_name(dst.name + ".data")
    # This reads every weight into memory once; the steps before it never do except simplify.
    model = onnx.load(str(final))
    if _tensor_bytes(model) > LARGE_MODEL_BYTES:
        side_file.unlink(missing_ok=True)
        onnx.save_model(
            model, str(dst), save_as_external_data=True, all_tensors_to_one_file=True,
            location=side_file.name, size_threshold=1024,
        )
    else:
        # A stale side file from an earlier large run would be confusing next to a self-contained model.
        side_file.unlink(missing_ok=True)
        onnx.save(model, str(dst))


def save_model(model: onnx.ModelProto, path: str | Path) -> None:
    """Save a model as one file, or with its weights in `<name>.data` beside it when it is large."""
    path = Path(path)
    if _tensor_bytes(model) > LARGE_MODEL_BYTES:
        onnx.save_model(
            model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
            location=path.name + ".data", size_threshold=1024,
        )
    else:
        onnx.save(model, str(path))


def _tensor_bytes(model: onnx.ModelProto) -> int:
    return sum(len(tensor.raw_data) for tensor in model.graph.initializer)


def _external_locations(model: onnx.ModelProto) -> list[str]:
    locations = set()
    for tensor in iter_tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            locations.update(entry.value for entry in tensor.external_data if entry.key == "location")
    return sorted(locations)


def _signature(model: onnx.ModelProto) -> tuple:
    initializers = {tensor.name for tensor in model.graph.initializer}
    inputs = tuple(
        (value.name, value.type.tensor_type.elem_type) for value in model.graph.input if value.name not in initializers
    )
    outputs = tuple((value.name, value.type.tensor_type.elem_type) for value in model.graph.output)
    return inputs, outputs


def convert_command(request: dict, work: Path) -> dict[str, Any]:
    """The sandbox's `onnx.convert` command: convert_model on a user's model; the caller takes `converted.onnx` from its folder.

    `written` names every other file the conversion left (external data), which the caller cannot use as one model.
    """
    out = work / "converted" / "converted.onnx"
    report = convert_model(Path(request["model"]), out)
    report["written"] = sorted(path.name for path in out.parent.iterdir() if path.name != out.name)
    return report
