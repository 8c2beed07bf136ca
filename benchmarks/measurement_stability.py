"""Measurement stability: the same pair of variants timed N times, quiet and beside a concurrent build, raw and as Kiln decides.

Two pairs of variants of one MLP are timed the way the agent times them, N times under each of three conditions:
the same variant twice (FP32 against a second compilation of itself: the truth is a tie) and FP32 against its
INT8-dynamic build (the truth is a clear speed-up). The conditions:

- quiet: nothing else of Kiln's runs;
- build, no quiet windows: a build (static INT8 calibration in a child process, as the worker runs it) loops
  beside the timing, as it did before builds paused for the agent;
- build, quiet windows: the same loop, but the timing holds the host's quiet window (devices/quiet.py), so the
  build stands paused (SIGSTOP) while the agent times and continues after.

Per repetition two figures are taken of the ratio first p50 / second p50, each with its verdict in the interval
language (faster / slower / tie):

- raw: each variant benchmarked once, one after the other (the first pass: separate windows), the verdict read
  from each run's own window medians as the report read first passes;
- Kiln: the pair timed side by side in rotated rounds until the leader separates at 95% (or 12 rounds), read as
  the decision reads them (kiln_contract/paired.py, workers/noise.py).

Prints, per pair and condition, the spread of each ratio over the repetitions (min to max, and the coefficient
of variation) and the verdicts each gave; then peak memory and wall time. Kiln's decision should be the same
verdict every time where the raw numbers wander.

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

from devices import bench, quiet
from devices.backends.onnxruntime import OnnxRuntimeBackend
from kiln_contract import paired
from workers.noise import Timing, latency_ratio

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


def first_pass(runs, settings, windows: bool) -> tuple[float, str]:
    """Each variant benchmarked once, one after the other: (first p50 / second p50, the verdict on the second)."""
    timings = []
    for run in runs:
        if windows:
            result, _ = quiet.measure_quietly(lambda run=run: bench.measure(run, settings), retakes=0)
        else:
            result = bench.measure(run, settings)
        latency = result["latency_ms"]
        timings.append(Timing(p50=latency["p50"], windows=tuple(result["window_medians_ms"]), cv=latency["cv"], count=latency["count"]))
    ratio = latency_ratio(timings[1], timings[0])
    return ratio.ratio, ratio.comparison


def side_by_side(runs, settings, windows: bool) -> tuple[float, float, float, str, int]:
    """Rotated rounds until the leader separates (or MAX_ROUNDS); (ratio, low, high, verdict, rounds) for the second against the first."""
    medians: list[list[float]] = [[], []]
    while True:
        shift = len(medians[0])
        if windows:
            values, _ = quiet.measure_quietly(lambda shift=shift: bench.interleaved_round(runs, settings, shift=shift), retakes=0)
        else:
            values = bench.interleaved_round(runs, settings, shift=shift)
        for index, value in enumerate(values):
            medians[index].append(value)
        if paired.stop_reason(medians, max_rounds=MAX_ROUNDS):
            break
    first, second = (Timing(p50=paired.median(values), interleaved=tuple(values)) for values in medians)
    ratio = latency_ratio(second, first)
    return ratio.ratio, ratio.low, ratio.high, ratio.comparison, len(medians[0])


def counted(verdicts: list[str]) -> str:
    return ", ".join(f"{verdict} x{verdicts.count(verdict)}" for verdict in sorted(set(verdicts)))


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
        compiled = {name: backend.compile(path, root / f"compiled-{name}", threads=args.threads)
                    for name, path in (("fp32", model), ("fp32-again", model), ("int8", int8))}
        feeds = {"input": np.random.default_rng(2).standard_normal((1, args.width)).astype(np.float32)}
        pairs = {"FP32 vs itself (truth: tie)": ("fp32", "fp32-again"), "FP32 vs INT8-dynamic (truth: faster)": ("fp32", "int8")}
        settings_first = bench.BenchmarkSettings.from_dict(FIRST_PASS)
        window = bench.BenchmarkSettings.from_dict(bench.INTERLEAVED_WINDOW)
        print(f"MLP {args.width}x{args.width}x4, batch 1, {args.threads} thread(s), {args.repeats} repetitions; "
              f"load average at start {os.getloadavg()[0]:.1f}")
        peak_build = 0.0
        for pair, (first_name, second_name) in pairs.items():
            runs = [compiled[first_name].bind(feeds), compiled[second_name].bind(feeds)]
            print(f"\n{pair}")
            print(f"  {'condition':<26} {'raw ratio (first pass)':<31} {'raw verdicts':<22} {'Kiln ratio (side by side)':<31} Kiln verdicts (rounds)")
            for name, with_build, windows in (("quiet", False, False), ("build, no quiet windows", True, False),
                                              ("build, quiet windows", True, True)):
                loop = None
                if with_build:
                    loop = BuildLoop(model, calibration, root)
                    loop.start()
                    time.sleep(1.0)  # the build's child is running before the first measurement
                raw, raw_verdicts, kiln, verdicts, rounds = [], [], [], [], []
                try:
                    for _ in range(args.repeats):
                        ratio, verdict = first_pass(runs, settings_first, windows)
                        raw.append(ratio)
                        raw_verdicts.append(verdict)
                        ratio, _, _, verdict, count = side_by_side(runs, window, windows)
                        kiln.append(ratio)
                        verdicts.append(verdict)
                        rounds.append(count)
                finally:
                    if loop is not None:
                        loop.done.set()
                        loop.join(600)
                        peak_build = max(peak_build, loop.peak_rss_mb)
                built = f"; {loop.builds} build(s) beside it, paused {loop.paused_s:.1f} s" if loop else ""
                print(f"  {name:<26} {spread(raw):<31} {counted(raw_verdicts):<22} {spread(kiln):<31} {counted(verdicts)} "
                      f"({min(rounds)}-{max(rounds)}){built}")
        for compiled_model in compiled.values():
            compiled_model.close()
    print(f"peak memory: this process {bench.peak_rss_mb():.0f} MB, a build {peak_build:.0f} MB; wall time {time.monotonic() - started:.0f} s; "
          f"load average at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
