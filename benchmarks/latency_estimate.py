"""How well Kiln predicts a model's latency before measuring it: leave-one-out over a zoo of models.

Every model of the zoo is compiled, timed and profiled per operator on this machine with the
agent's own ONNX Runtime backend and benchmark protocol (one thread, batch 1). Then each model is
estimated from the others only (kiln.reports.estimate: per-operator rates over work from shapes),
side by side with a naive competitor that knows only the device's overall rate (time over total
work, no per-operator rates). Prints each estimate's error, the median absolute error of both and
their ratio.

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
from kiln.reports.estimate import Rates, estimate_ms, fit_rates, median_abs_error, relative_error
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


def measure(name: str, model: onnx.ModelProto, work_dir: Path) -> dict:
    path = work_dir / f"{len(list(work_dir.iterdir()))}.onnx"
    onnx.save(model, path)
    compiled = OnnxRuntimeBackend().compile(path, work_dir / f"{path.stem}-compiled", threads=1)
    try:
        feeds = make_feeds(compiled.input_specs, 1)
        metrics = bench.run_benchmark(compiled, {1: feeds}, SETTINGS, load_ms=0.0)
        profile = compiled.profile(feeds, runs=10)
    finally:
        compiled.close()
    return {"name": name, "p50_ms": metrics["latency_ms"]["p50"], "op_work": op_work(path), "profile_by_op_type": profile["by_op_type"]}


def main() -> None:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kiln-estimate-") as scratch:
        rows = [measure(name, model, Path(scratch)) for name, model in zoo().items()]
    ours, naive = [], []
    print(f"{'model':28} {'measured ms':>12} {'estimate ms':>12} {'error':>8} {'naive ms':>10} {'naive error':>12} {'op coverage':>12}")
    for row in rows:
        others = [other for other in rows if other is not row]
        rates = fit_rates(others)
        estimate, coverage = estimate_ms(row["op_work"], rates)
        naive_estimate, _ = estimate_ms(row["op_work"], Rates(per_op={}, overall=rates.overall))
        ours.append((estimate, row["p50_ms"]))
        naive.append((naive_estimate, row["p50_ms"]))
        print(f"{row['name']:28} {row['p50_ms']:12.4f} {estimate:12.4f} {relative_error(estimate, row['p50_ms']):+8.0%} {naive_estimate:10.4f} "
              f"{relative_error(naive_estimate, row['p50_ms']):+12.0%} {coverage:12.0%}")
    ours_median, naive_median = median_abs_error(ours), median_abs_error(naive)
    print(f"\nmedian |error| over {len(rows)} models, leave-one-out: Kiln {ours_median:.1%}, naive overall rate {naive_median:.1%}; "
          f"ratio naive/Kiln {naive_median / ours_median:.2f}x")
    print(f"wall time {time.perf_counter() - started:.1f} s; p50 spread of the zoo {min(r['p50_ms'] for r in rows):.3f}–"
          f"{max(r['p50_ms'] for r in rows):.3f} ms; median p50 {statistics.median(r['p50_ms'] for r in rows):.3f} ms")


if __name__ == "__main__":
    main()
