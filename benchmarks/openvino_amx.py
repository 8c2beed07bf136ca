"""OpenVINO's INT8 IR with and without AMX: accuracy and p50 of the same files, oneDNN capped below AMX in a second run.

On a CPU with AMX, OpenVINO 2026.4's INT8 path broke MiniLM-L3's NNCF IR (cosine_p5 0.48 against 0.998 with AMX
capped; benchmarks/RESULTS.md). This builds FP32 and NNCF's IR (defaults and the transformer preset) of one real model,
scores each on OpenVINO with the CPU's default float precision and with the f32 hint, times them in interleaved windows,
then runs itself again with `ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI` (oneDNN reads it once, at load) and prints both.

Run: `.venv/bin/python benchmarks/openvino_amx.py minilm` (any name `benchmarks/quantization.py --zoo` knows; about 2 min).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform"), str(ROOT / "benchmarks")]

from quantization import evaluate, interleaved_p50, learned_build, prepare_models

CAPPED_ISA = "AVX512_CORE_VNNI"
PRESETS = (("ov-int8", {"runtime": "openvino"}), ("ov-int8-transformer", {"runtime": "openvino", "model_type": "transformer"}))


def measure(only: str) -> None:
    work = Path(tempfile.mkdtemp(prefix="openvino-amx-"))
    model = next(candidate for candidate in prepare_models(work, zoo_only=True) if only in candidate["name"])
    fp32 = learned_build(model, "fp32", "kiln", "fp32", {}, work)
    rows = [fp32, {**fp32, "key": "fp32 (f32)", "backend": "openvino"}]
    for key, options in PRESETS:
        built = {**learned_build(model, key, "kiln", "int8", options, work), "backend": "openvino"}
        rows += [built, {**built, "key": f"{key} + f32 hint", "compile": {"inference_precision": "f32"}}]
    evaluate(rows, model, work)
    interleaved_p50(rows, 7)
    mode = f"oneDNN capped at {os.environ['ONEDNN_MAX_CPU_ISA']}" if os.environ.get("ONEDNN_MAX_CPU_ISA") else "all ISA (AMX on)"
    print(f"\n{model['name']}, {mode}")
    for row in rows[1:]:
        accuracy = row["accuracy"]
        print(f"  {row['key']:32s} {accuracy.get('metric')} {accuracy.get('value'):.4f} {'ok' if accuracy.get('within_tolerance') else 'misses'}"
              f"  p50 {row['p50']:.3f} ms", flush=True)


def main() -> None:
    only = sys.argv[1] if len(sys.argv) > 1 else "minilm"
    measure(only)
    if not os.environ.get("ONEDNN_MAX_CPU_ISA"):
        subprocess.run([sys.executable, __file__, only], env={**os.environ, "ONEDNN_MAX_CPU_ISA": CAPPED_ISA}, check=True)


if __name__ == "__main__":
    main()
