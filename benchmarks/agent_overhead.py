"""Overhead of the agent's benchmark harness over a bare loop of the runtime's own run().

One process, one ONNX Runtime session, one small CNN built here with onnx.helper. Rounds
interleave a bare `session.run()` loop with `devices.bench.measure()` on the same session (the
order alternates each round) so that drift of a shared machine hits both alike. Prints the median
over rounds of each side's p50 and their ratio; exits 1 when the harness's p50 is more than 5%
above the bare loop's.

    python benchmarks/agent_overhead.py [--rounds 9] [--runs 200] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devices import bench
from devices.backends.onnxruntime import OnnxRuntimeBackend

MAX_RATIO = 1.05


def build_cnn(path: Path) -> None:
    """Three 3x3 convolutions with ReLU, global pooling and a classifier: a few ms per run."""
    rng = np.random.default_rng(0)
    initializers, nodes = [], []
    channels, previous = [3, 32, 64, 128], "input"
    for index, (c_in, c_out) in enumerate(zip(channels, channels[1:])):
        weight = rng.standard_normal((c_out, c_in, 3, 3)).astype(np.float32) * 0.1
        initializers += [numpy_helper.from_array(weight, f"w{index}"),
                         numpy_helper.from_array(np.zeros(c_out, np.float32), f"b{index}")]
        nodes += [
            helper.make_node("Conv", [previous, f"w{index}", f"b{index}"], [f"conv{index}"],
                             pads=[1, 1, 1, 1], strides=[1 if index == 0 else 2] * 2),
            helper.make_node("Relu", [f"conv{index}"], [f"relu{index}"]),
        ]
        previous = f"relu{index}"
    initializers += [
        numpy_helper.from_array(rng.standard_normal((10, channels[-1])).astype(np.float32), "fc_w"),
        numpy_helper.from_array(np.zeros(10, np.float32), "fc_b"),
    ]
    nodes += [
        helper.make_node("GlobalAveragePool", [previous], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "overhead_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 160, 160])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def bare_loop(session, feeds, runs: int) -> list[float]:
    """What anyone would write to time session.run(): ms per call."""
    samples = []
    for _ in range(runs):
        started = time.perf_counter_ns()
        session.run(None, feeds)
        samples.append((time.perf_counter_ns() - started) / 1e6)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--runs", type=int, default=200, help="timed runs per side per round")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as work_dir:
        model_path = Path(work_dir) / "cnn.onnx"
        build_cnn(model_path)
        compiled = OnnxRuntimeBackend().compile(model_path, work_dir, threads=args.threads)
        session = compiled.session
        feeds = {"input": np.random.default_rng(1).standard_normal((1, 3, 160, 160)).astype(np.float32)}
        settings = bench.BenchmarkSettings(warmup_runs=10, warmup_seconds=0.0,
                                           min_runs=args.runs, min_seconds=0.0)
        bare_loop(session, feeds, 20)  # first-run effects out of the way

        bare_p50s, harness_p50s = [], []
        for round_number in range(args.rounds):
            def bare():
                bare_loop(session, feeds, settings.warmup_runs)
                bare_p50s.append(statistics.median(bare_loop(session, feeds, args.runs)))

            def harness():
                result = bench.measure(compiled.bind(feeds), settings)
                harness_p50s.append(result["latency_ms"]["p50"])

            for side in (bare, harness) if round_number % 2 == 0 else (harness, bare):
                side()
            print(f"round {round_number + 1}: bare p50 {bare_p50s[-1]:.4f} ms, "
                  f"harness p50 {harness_p50s[-1]:.4f} ms")

    bare_p50 = statistics.median(bare_p50s)
    harness_p50 = statistics.median(harness_p50s)
    ratio = harness_p50 / bare_p50
    print(f"bare session.run() p50: {bare_p50:.4f} ms (median of {args.rounds} rounds)")
    print(f"devices.bench      p50: {harness_p50:.4f} ms (median of {args.rounds} rounds)")
    print(f"ratio harness / bare: {ratio:.4f} (limit {MAX_RATIO:.2f})")
    if ratio > MAX_RATIO:
        print("FAIL: the harness adds more than 5% to the p50", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
