"""Learned quantization (AdaRound on calibrated QDQ graphs) against calibrated INT8, side by side on this CPU.

For each model (the rounding-sensitive MLP of tests/fixtures/rounding.py, made so that calibrated
INT8 misses 1%; and, with `--zoo`, ddddocr's CTC captcha recognizer from tests/fixtures/zoo.py) this
builds, each in its own spawned process so that its peak RSS is its own:

- FP32 (the reference, on ONNX Runtime),
- `quantize_static`-like per-tensor MinMax INT8 (ONNX Runtime's defaults, `int8-minmax`),
- Kiln's calibrated per-channel MSE INT8 (`int8-mse`) where it builds,
- learned rounding (`-adaround`) and QAT with distillation (`-qat`) on that calibration
  (`learn_seconds` as given), each recipe's learning curve summarised under the table,

then scores every row again from its file against FP32 (devices.metrics through devices.contract,
as on a device: cosine for the MLP, top-1 agreement per step for the CTC recognizer) and times
them interleaved (one thread, round-robin windows, the median of the window p50s). It prints build
wall time, learning time, peak RSS of the build, accuracy, p50 and the ratios to FP32 and to the
calibrated INT8 it started from.

Run: `.venv/bin/python benchmarks/learned_quantization.py [--zoo] [--seconds 60]`.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]

from benchmarks.quantization import evaluate, interleaved_p50
from tests.fixtures.models import write_npz
from tests.fixtures.rounding import build_rounding_sensitive_mlp, rounding_inputs
from tests.fixtures.zoo import zoo_model

CALIBRATED = {"calibration_method": "mse", "per_channel": True}
ORT_DEFAULT = {"calibration_method": "minmax", "per_channel": False}


def recipes(model: dict, seconds: float) -> list[tuple[str, str, dict]]:
    """FP32, both calibrated families, and each learned recipe on the model's base family."""
    base_key, base = model["base"]
    rows = [("fp32", "fp32", {}), ("int8-minmax", "int8", ORT_DEFAULT)]
    if base_key != "int8-minmax":
        rows.append((base_key, "int8", base))
    rows.append((f"{base_key}-adaround", "int8", {**base, "learn": "adaround", "learn_seconds": seconds}))
    rows.append((f"{base_key}-qat", "int8", {**base, "learn": "qat", "learn_seconds": seconds}))
    return rows


def _build_in_child(model_path: str, precision: str, out_path: str, calibration: str, options: dict, queue) -> None:
    import torch

    torch.set_num_threads(1)
    from workers.quantize import build_variant

    started = time.perf_counter()
    try:
        built = build_variant(model_path=model_path, precision=precision, out_path=out_path, calibration_path=calibration, options=options)
    except Exception as exc:
        queue.put({"error": f"{type(exc).__name__}: {exc}"[:300], "wall_s": time.perf_counter() - started,
                   "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
        return
    learned = built["recipe"].get("learned") or {}
    queue.put({"wall_s": time.perf_counter() - started, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               "learn_s": learned.get("seconds"), "layers": len(learned.get("layers", [])), "samples": learned.get("samples"),
               "curve": learned.get("curve", [])})


def build(model: dict, key: str, precision: str, options: dict, work: Path) -> dict:
    """One recipe, built in a fresh spawned process: its wall time and peak RSS are its own."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    out = work / f"{model['name']}-{key}.onnx"
    process = context.Process(target=_build_in_child, args=(str(model["path"]), precision, str(out), str(model["calibration"]), options, queue))
    process.start()
    result = queue.get()
    process.join()
    return {"key": key, "backend": "onnxruntime", "path": out, **result}


def rounding_model(work: Path) -> dict:
    path = work / "rounding-mlp.onnx"
    onnx.save(build_rounding_sensitive_mlp(), path)
    return {"name": "rounding-mlp", "path": path, "input": "input", "tolerance": {"metric": "cosine", "max_drop": 0.01},
            "calibration": write_npz(work / "rounding-calibration.npz", input=rounding_inputs(samples=128, seed=1)),
            "validation": write_npz(work / "rounding-validation.npz", input=rounding_inputs(samples=256, seed=2)),
            "label": "rounding-sensitive MLP (cosine)", "base": ("int8-mse", CALIBRATED)}


def ddddocr_model(work: Path) -> dict:
    zoo = zoo_model("ddddocr-recognizer")
    if zoo.path is None:
        raise SystemExit("ddddocr is not installed (it is in the dev extra)")
    return {"name": zoo.name, "path": zoo.path, "input": zoo.input_name, "tolerance": {"metric": "auto", "max_drop": 0.01},
            "calibration": write_npz(work / "ddddocr-calibration.npz", **zoo.inputs(32, seed=1)),
            "validation": write_npz(work / "ddddocr-validation.npz", **zoo.inputs(32, seed=2)),
            # Per-channel MSE calibration does not build on this model (no runtime loads it); ORT's default does.
            "label": "ddddocr recognizer (CTC: top-1 agreement per step)", "base": ("int8-minmax", ORT_DEFAULT)}


def print_table(model: dict, rows: list[dict], failed: list[dict]) -> None:
    fp32 = next(row for row in rows if row["key"] == "fp32")
    calibrated = next(row for row in rows if row["key"] == model["base"][0])
    print(f"\n## {model['label']}\n")
    print(f"| recipe | build wall s | learning s | peak RSS MB | accuracy | p50 ms | speed vs FP32 | speed vs {calibrated['key']} |")
    print("|---|---|---|---|---|---|---|---|")
    for row in failed:
        print(f"| {row['key']} | {row['wall_s']:.1f} | - | {row['peak_rss_mb']:.0f} | not built: {row['error']} | | | |")
    for row in rows:
        accuracy = row["accuracy"]
        mark = "✓" if accuracy.get("within_tolerance") else "✗"
        learn = f"{row['learn_s']:.1f}" if row.get("learn_s") is not None else "-"
        print(f"| {row['key']} | {row['wall_s']:.1f} | {learn} | {row['peak_rss_mb']:.0f} | {accuracy.get('metric')} {accuracy.get('value'):.4f} {mark} "
              f"| {row['p50']:.3f} | {fp32['p50'] / row['p50']:.2f}x | {calibrated['p50'] / row['p50']:.2f}x |")
    for learned in (row for row in rows if row.get("curve")):
        curve = learned["curve"]
        print(f"\n{learned['key']}: learned on {learned['samples']} samples; loss {curve[0]:.4g} -> {curve[-1]:.4g} "
              f"(min {min(curve):.4g}) over {len(curve)} curve points")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", action="store_true", help="also ddddocr's CTC recognizer (tests/fixtures/zoo.py)")
    parser.add_argument("--only-zoo", action="store_true", help="only ddddocr's recognizer")
    parser.add_argument("--seconds", type=float, default=60.0, help="learning budget per learned variant")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timing windows per row")
    arguments = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kiln-learned-bench-") as scratch:
        work = Path(scratch)
        models = ([] if arguments.only_zoo else [rounding_model(work)]) + ([ddddocr_model(work)] if arguments.zoo or arguments.only_zoo else [])
        for model in models:
            built = [build(model, key, precision, options, work) for key, precision, options in recipes(model, arguments.seconds)]
            rows, failed = [row for row in built if "error" not in row], [row for row in built if "error" in row]
            evaluate(rows, model, work)
            interleaved_p50(rows, arguments.rounds)
            print_table(model, rows, failed)
            for row in rows:
                row["compiled"].close()
    print(f"\nwall time {time.perf_counter() - started:.0f} s; this process's peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
