"""OpenVINO INT8 built three ways on the real zoo models, side by side in one process (issue 24).

Per model, every row is judged by the model's kind metric against FP32 on ONNX Runtime and timed in
round-robin windows (the agent's own interleaving), batch 1, one thread:

- FP32 on ONNX Runtime and on OpenVINO (f32, as Kiln compiles an FP32 artifact), and bf16 on OpenVINO;
- Kiln's ONNX Runtime INT8 (the QDQ file, `int8-mse`) on ONNX Runtime, and the SAME file read by OpenVINO,
  with the plugin's defaults and with `INFERENCE_PRECISION_HINT=f32` (what Kiln did before issue 24);
- OpenVINO's own INT8 (`ov-int8`: nncf.quantize on OpenVINO's model, an IR), with the plugin's defaults
  (what Kiln does now) and with the f32 hint forced (what it did before).

Ratios are against the `ov-int8` IR with defaults (> 1: that row is slower). A QDQ row that OpenVINO
misreads shows as a metric far below its ONNX Runtime twin; the f32 hint's cost as the last row's ratio.

Run: `.venv/bin/python benchmarks/openvino_int8.py [--only NAME] [--rounds 9]` (about 1-2 minutes per model).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]

from benchmarks.quantization import _own_peak_rss_mb, evaluate, interleaved_p50, prepare_models, ratio_interval
from workers.quantize import build_variant
from workers.quantize.openvino_family import openvino_spec

KILN_QDQ = {"calibration_method": "mse", "per_channel": True, "activation_type": "uint8", "weight_type": "int8", "reduce_range": False}
F32 = {"inference_precision": "f32"}


def build_rows(model: dict, work: Path) -> list[dict]:
    """The rows of one model; a build that fails is printed and left out."""
    name = model["name"].split()[0]
    rows = [{"row": "FP32", "path": model["path"], "backend": "onnxruntime"},
            {"row": "FP32 (f32)", "path": model["path"], "backend": "openvino"},
            {"row": "FP32 under bf16 hint", "path": model["path"], "backend": "openvino", "compile": {"inference_precision": "bf16"}}]
    builds = {"qdq": ("int8", KILN_QDQ, work / f"{name}-int8-mse.onnx"),
              "ir": ("int8", openvino_spec()["options"], work / f"{name}-ov-int8.openvino.tar")}
    built = {}
    for key, (precision, options, out) in builds.items():
        started = time.perf_counter()
        try:
            build_variant(model_path=model["path"], precision=precision, out_path=out, calibration_path=model["calibration"], options=options)
            built[key] = out
            print(f"  built {key} in {time.perf_counter() - started:.1f} s")
        except Exception as error:  # a failed build is a result too
            print(f"  {key} build failed: {type(error).__name__}: {str(error)[:200]}")
    if "qdq" in built:
        rows += [{"row": "Kiln QDQ INT8 (int8-mse)", "path": built["qdq"], "backend": "onnxruntime"},
                 {"row": "same QDQ file read by OpenVINO", "path": built["qdq"], "backend": "openvino"},
                 {"row": "same QDQ file, OpenVINO, f32 hint", "path": built["qdq"], "backend": "openvino", "compile": F32}]
    if "ir" in built:
        rows += [{"row": "ov-int8 IR (NNCF on OpenVINO), defaults", "path": built["ir"], "backend": "openvino", "base": True},
                 {"row": "ov-int8 IR, f32 hint forced", "path": built["ir"], "backend": "openvino", "compile": F32}]
    return rows


def measure(model: dict, work: Path, rounds: int) -> list[dict]:
    rows = build_rows(model, work)
    kept = []
    for row in rows:
        try:
            # FP32 on ONNX Runtime first, as the reference (compiled again beside each row: small next to the builds).
            evaluate([rows[0], row] if row is not rows[0] else [row], model, work)
            kept.append(row)
        except Exception as error:
            print(f"  {row['row']} on {row['backend']} failed: {type(error).__name__}: {str(error)[:200]}")
    interleaved_p50(kept, rounds)
    return kept


def print_table(model: dict, rows: list[dict]) -> None:
    base = next((row for row in rows if row.get("base")), None)
    print(f"\n## {model['name']}")
    print(f"| {'row':<42} | {'backend':<11} | {'metric':<15} | {'value':>7} | {'ok':<3} | {'p50 ms':>8} | ratio to ov-int8 IR [90%] |")
    print(f"|{'-' * 44}|{'-' * 13}|{'-' * 17}|{'-' * 9}|{'-' * 5}|{'-' * 10}|{'-' * 27}|")
    for row in rows:
        accuracy = row["accuracy"]
        ratio = "" if base is None else ("1.00 (base)" if row is base else "{:.2f}x [{:.2f}, {:.2f}]".format(*ratio_interval(row["windows"], base["windows"])))
        print(f"| {row['row']:<42} | {row['backend']:<11} | {accuracy['metric']:<15} | {accuracy['value']:>7.4f} | "
              f"{'yes' if accuracy['within_tolerance'] else 'no':<3} | {row['p50']:>8.3f} | {ratio:<25} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="only models whose name contains this")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved windows per row")
    arguments = parser.parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kiln-ov-int8-") as scratch:
        work = Path(scratch)
        for model in prepare_models(work, zoo_only=True):
            if arguments.only and arguments.only not in model["name"]:
                continue
            print_table(model, measure(model, work, arguments.rounds))
    print(f"\nwall time {time.perf_counter() - started:.0f} s, peak RSS {_own_peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
