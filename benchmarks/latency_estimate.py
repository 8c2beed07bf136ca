"""How well Kiln predicts a model's latency before measuring it: leave-one-out over a zoo of models.

Every model of the zoo is compiled, timed and profiled per operator on this machine with the
agent's own ONNX Runtime backend and benchmark protocol (one thread, batch 1). Then each model is
estimated from the others only (kiln.reports.estimate: a per-node cost and per-work rates fitted
on the per-operator timings), side by side with a naive competitor that scales the others' total
time by total work (no per-operator timings, no per-node cost). Prints each estimate's error, the
median absolute error of both and their ratio, and whether each measured p50 fell inside the range
Kiln gives its estimate (kiln.reports.estimate.estimate_range: the worst leave-one-out miss among the
other models, itself computed without the model being estimated), and the range with one model
measured next to the device's whole-model fit (no profiles), as a new kind of model gets it.

    python benchmarks/latency_estimate.py
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform"), str(ROOT / "benchmarks")]

from devices import bench
from devices.agent.runner import make_feeds
from devices.backends.onnxruntime import OnnxRuntimeBackend
from kiln.reports.estimate import estimate_ms, estimate_range, fit_rates, median_abs_error, relative_error
from tests.fixtures.mlp import train_digits_mlp
from tests.fixtures.models import build_transformer_like, train_digits_cnn
from tests.fixtures.sensitive import build_sensitive_mlp
from workers.cost import op_work

SETTINGS = bench.BenchmarkSettings(warmup_runs=5, warmup_seconds=0.1, min_runs=30, min_seconds=0.5)


def zoo() -> dict[str, onnx.ModelProto]:
    from quantization import resnet18_like

    return {
        "digits CNN": train_digits_cnn().model,
        "digits MLP": train_digits_mlp().model,
        "MLP 64": build_sensitive_mlp(width=64),
        "MLP 512": build_sensitive_mlp(width=512),
        "BERT-shaped s16 h32": build_transformer_like(seq_len=16, hidden=32),
        "BERT-shaped s64 h64 x2": build_transformer_like(seq_len=64, hidden=64, heads=4, layers=2),
        "BERT-shaped s128 h128 x2": build_transformer_like(seq_len=128, hidden=128, heads=4, layers=2),
        "ResNet-18-shaped 224": resnet18_like(),
    }


ROUNDS = 3
PROFILE_RUNS = 50


def measure_zoo(models: dict[str, onnx.ModelProto], work_dir: Path) -> list[dict]:
    """Compile every model, then time them in interleaved rounds (the median p50 of each), then profile each."""
    compiled, rows = {}, []
    for index, (name, model) in enumerate(models.items()):
        path = work_dir / f"{index}.onnx"
        onnx.save(model, path)
        compiled[name] = OnnxRuntimeBackend().compile(path, work_dir / f"{index}-compiled", threads=1)
        counts: dict[str, int] = {}
        for node in model.graph.node:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
        rows.append({"name": name, "op_work": op_work(path), "op_histogram": counts, "p50s": []})
    try:
        # Interleaved rounds: a busy moment of a shared machine hits every model, not one.
        for _ in range(ROUNDS):
            for row in rows:
                engine = compiled[row["name"]]
                metrics = bench.run_benchmark(engine, {1: make_feeds(engine.input_specs, 1)}, SETTINGS, load_ms=0.0)
                row["p50s"].append(metrics["latency_ms"]["p50"])
        for row in rows:
            engine = compiled[row["name"]]
            row["profile_by_op_type"] = engine.profile(make_feeds(engine.input_specs, 1), runs=PROFILE_RUNS)["by_op_type"]
            row["p50_ms"] = statistics.median(row["p50s"])
    finally:
        for engine in compiled.values():
            engine.close()
    return rows


def naive_estimate(row: dict, others: list[dict]) -> float:
    """The others' total time over their total work, times this model's work."""
    rate = sum(o["p50_ms"] for o in others) / sum(sum(o["op_work"].values()) for o in others)
    return rate * sum(row["op_work"].values())


def main() -> None:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kiln-estimate-") as scratch:
        rows = measure_zoo(zoo(), Path(scratch))
    ours, naive_pairs, inside, whole_model = [], [], 0, []
    print(f"{'model':28} {'measured ms':>12} {'estimate ms':>12} {'error':>8} {'naive ms':>10} {'naive error':>12} {'op coverage':>12} "
          f"{'range ms':>18} {'in range':>9}")
    for row in rows:
        others = [{**other, "model_sha256": other["name"]} for other in rows if other is not row]
        estimate, coverage = estimate_ms(row["op_work"], row["op_histogram"], fit_rates(others))
        ranged = estimate_range(row["op_work"], row["op_histogram"], others)
        naive = naive_estimate(row, others)
        ours.append((estimate, row["p50_ms"]))
        naive_pairs.append((naive, row["p50_ms"]))
        hit = ranged["low_ms"] <= row["p50_ms"] <= ranged["high_ms"]
        inside += hit
        # The same without any profile: every other model a whole-model point, as a runtime with its own kernel names gives.
        unprofiled = [{**other, "profile_by_op_type": []} for other in others]
        whole_model.append((estimate_ms(row["op_work"], row["op_histogram"], fit_rates(unprofiled))[0], row["p50_ms"]))
        print(f"{row['name']:28} {row['p50_ms']:12.4f} {estimate:12.4f} {relative_error(estimate, row['p50_ms']):+8.0%} {naive:10.4f} "
              f"{relative_error(naive, row['p50_ms']):+12.0%} {coverage:12.0%} {ranged['low_ms']:8.4f}–{ranged['high_ms']:<9.4f} {'yes' if hit else 'NO':>9}")
    ours_median, naive_median = median_abs_error(ours), median_abs_error(naive_pairs)
    print(f"\nmedian |error| over {len(rows)} models, leave-one-out: Kiln {ours_median:.1%}, naive overall rate {naive_median:.1%}; "
          f"ratio naive/Kiln {naive_median / ours_median:.2f}x")
    print(f"measured p50 inside Kiln's range: {inside} of {len(rows)}; without profiles (whole-model points only) the median |error| is "
          f"{median_abs_error(whole_model):.1%}")
    print(f"wall time {time.perf_counter() - started:.1f} s; p50 spread of the zoo {min(r['p50_ms'] for r in rows):.3f}–"
          f"{max(r['p50_ms'] for r in rows):.3f} ms; median p50 {statistics.median(r['p50_ms'] for r in rows):.3f} ms")


if __name__ == "__main__":
    main()
