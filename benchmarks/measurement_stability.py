"""Measurement stability: the same pair of variants timed N times, quiet and beside a concurrent build, raw and as Kiln decides.

Two variants of one MLP (FP32 and its INT8-dynamic build) are timed the way the agent times them, N times
under each of three conditions:

- quiet: nothing else of Kiln's runs;
- build, no quiet windows: a build (static INT8 calibration in a child process, as the worker runs it) loops
  beside the timing, as it did before builds paused for the agent;
- build, quiet windows: the same loop, but the timing holds the host's quiet window (devices/quiet.py), so the
  build stands paused (SIGSTOP) while the agent times and continues after.

Per repetition two figures are taken of the ratio FP32 p50 / INT8 p50:

- raw: each variant benchmarked once, one after the other (the first pass: separate windows);
- Kiln: the finalists timed side by side in rotated rounds until the leader separates at 95% (or 12 rounds),
  read as the decision reads them (devices/paired.py, workers/noise.py): the ratio, its interval, and the verdict
  in the interval language (faster / slower / tie).

Prints, per condition, the spread of each ratio over the repetitions (min to max, and the coefficient of
variation) and how many distinct verdicts Kiln gave; then peak memory and wall time. Kiln's decision should
be the same verdict every time where the raw ratio wanders.

    python benchmarks/measurement_stability.py [--repeats 5] [--width 512] [--threads 1]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devices import bench, paired, quiet  # noqa: E402
from devices.backends.onnxruntime import OnnxRuntimeBackend  # noqa: E402
from workers.noise import Timing, latency_ratio  # noqa: E402

FIRST_PASS = {"warmup_runs": 10, "warmup_seconds": 0.2, "min_runs": 50, "min_seconds": 1.0}
MAX_ROUNDS = 12


def build_mlp(path: Path, width: int, layers: int = 4) -> None:
    """`layers` MatMul + Relu of `width` at batch 1: enough arithmetic for INT8 to matter."""
    rng = np.random.default_rng(0)
    nodes, initializers, current = [], [], "input"
    for index in range(layers):
        initializers.append(numpy_helper.from_array((rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32), f"w{index}"))
        nodes += [helper.make_node("MatMul", [current, f"w{index}"], [f"m{index}"]), helper.make_node("Relu", [f"m{index}"], [f"r{index}"])]
        current = f"r{index}"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, width])],
                              [helper.make_tensor_value_info(current, TensorProto.FLOAT, [1, width])], initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


class BuildLoop(threading.Thread):
    """Builds a static INT8 variant again and again in a child process, as the worker does, until stopped."""

    def __init__(self, model: Path, calibration: Path, work: Path):
        super().__init__(daemon=True)
        self.model, self.calibration, self.work = model, calibration, work
        self.done = threading.Event()
        self.builds = 0
        self.paused_s = 0.0
        self.peak_rss_mb = 0.0

    def run(self) -> None:
        from workers.quantize.isolated import build_isolated

        while not self.done.is_set():
            built = build_isolated(model_path=self.model, precision="int8", out_path=self.work / f"build-{self.builds}.onnx",
                                   calibration_path=self.calibration, options={"calibration_method": "entropy", "per_channel": True})
            self.builds += 1
            self.paused_s += built.get("paused_s") or 0.0
            self.peak_rss_mb = max(self.peak_rss_mb, built.get("peak_rss_mb") or 0.0)


def first_pass_ratio(runs, settings, windows: bool) -> float:
    """Each variant benchmarked once, one after the other: FP32 p50 / INT8 p50."""
    p50 = []
    for run in runs:
        if windows:
            result, _ = quiet.measure_quietly(lambda run=run: bench.measure(run, settings), retakes=0)
        else:
            result = bench.measure(run, settings)
        p50.append(result["latency_ms"]["p50"])
    return p50[0] / p50[1]


def side_by_side(runs, settings, windows: bool) -> tuple[float, float, float, str, int]:
    """Rotated rounds until the leader separates (or MAX_ROUNDS); (ratio, low, high, verdict, rounds) for INT8 against FP32."""
    medians: list[list[float]] = [[], []]
    while True:
        shift = len(medians[0])
        if windows:
            values, _ = quiet.measure_quietly(lambda: bench.interleaved_round(runs, settings, shift=shift), retakes=0)
        else:
            values = bench.interleaved_round(runs, settings, shift=shift)
        for index, value in enumerate(values):
            medians[index].append(value)
        if paired.stop_reason(medians, max_rounds=MAX_ROUNDS):
            break
    fp32, int8 = (Timing(p50=paired.median(values), interleaved=tuple(values)) for values in medians)
    ratio = latency_ratio(int8, fp32)
    return ratio.ratio, ratio.low, ratio.high, ratio.comparison, len(medians[0])


def spread(values: list[float]) -> str:
    cv = statistics.pstdev(values) / statistics.mean(values) if len(values) > 1 else 0.0
    return f"{min(values):.2f}x to {max(values):.2f}x (cv {cv:.1%})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kiln-stability-") as scratch:
        root = Path(scratch)
        os.environ[quiet.QUIET_DIR_ENV] = str(root / "quiet")  # the build loop and the timing share one host-local folder
        model = root / "mlp.onnx"
        build_mlp(model, args.width)
        calibration = root / "calibration.npz"
        np.savez(calibration, input=np.random.default_rng(1).standard_normal((256, args.width)).astype(np.float32))
        from workers.quantize.variants import build_variant

        int8 = root / "int8-dynamic.onnx"
        build_variant(model_path=model, precision="int8-dynamic", out_path=int8, calibration_path=None, options={})
        backend = OnnxRuntimeBackend()
        compiled = [backend.compile(path, root / f"compiled-{path.stem}", threads=args.threads) for path in (model, int8)]
        feeds = {"input": np.random.default_rng(2).standard_normal((1, args.width)).astype(np.float32)}
        runs = [model_.bind(feeds) for model_ in compiled]
        first_pass = bench.BenchmarkSettings.from_dict(FIRST_PASS)
        window = bench.BenchmarkSettings.from_dict(bench.INTERLEAVED_WINDOW)
        print(f"FP32 vs INT8-dynamic MLP {args.width}x{args.width}x4, batch 1, {args.threads} thread(s), {args.repeats} repetitions; "
              f"load average at start {os.getloadavg()[0]:.1f}")
        print(f"{'condition':<28} {'raw ratio (first pass)':<34} {'Kiln ratio (side by side)':<34} verdicts (rounds)")
        peak_build = 0.0
        for name, with_build, windows in (("quiet", False, False), ("build, no quiet windows", True, False),
                                          ("build, quiet windows", True, True)):
            loop = None
            if with_build:
                loop = BuildLoop(model, calibration, root)
                loop.start()
                time.sleep(1.0)  # the build's child is running before the first measurement
            raw, kiln, verdicts, rounds = [], [], [], []
            try:
                for _ in range(args.repeats):
                    raw.append(first_pass_ratio(runs, first_pass, windows))
                    ratio, _, _, verdict, count = side_by_side(runs, window, windows)
                    kiln.append(ratio)
                    verdicts.append(verdict)
                    rounds.append(count)
            finally:
                if loop is not None:
                    loop.done.set()
                    loop.join(600)
                    peak_build = max(peak_build, loop.peak_rss_mb)
            counted = ", ".join(f"{verdict} x{verdicts.count(verdict)}" for verdict in sorted(set(verdicts)))
            built = f"; {loop.builds} builds beside it, paused {loop.paused_s:.1f} s" if loop else ""
            print(f"{name:<28} {spread(raw):<34} {spread(kiln):<34} {counted} ({min(rounds)}-{max(rounds)}){built}")
        for model_ in compiled:
            model_.close()
    print(f"peak memory: this process {bench.peak_rss_mb():.0f} MB, a build {peak_build:.0f} MB; wall time {time.monotonic() - started:.0f} s; "
          f"load average at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
