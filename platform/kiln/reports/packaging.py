"""Deployment packages: per device, the recommended variant with its report and a script to run it."""
from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

from kiln.pipeline.models import Artifact
from kiln.registry.selectors import blob_file

RUN_SCRIPT = '''"""Run the packaged model with ONNX Runtime and time it: `python run.py inputs.npz`.

The inputs are an .npz with one array per model input (first axis = samples), as uploaded to Kiln.
"""
import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", help=".npz of input arrays, first axis = samples")
    parser.add_argument("--model", default="model.onnx")
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    session = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    with np.load(args.inputs, allow_pickle=False) as data:
        feeds = {name: data[name][:1] for name in names}
    for _ in range(10):
        session.run(None, feeds)
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append((time.perf_counter() - start) * 1000)
    print(f"p50 {statistics.median(times):.3f} ms over {args.runs} runs (batch 1)")


if __name__ == "__main__":
    main()
'''


def package_name(target: str) -> str:
    return "kiln-package-" + re.sub(r"[^A-Za-z0-9._-]+", "-", target).strip("-") + ".zip"


def _readme(job, device: dict, chosen: dict) -> str:
    latency = chosen.get("latency_ms") or {}
    accuracy = chosen.get("accuracy") or {}
    agent = device.get("agent") or {}
    return "\n".join([
        f"# {job.model_version.model.name} v{job.model_version.number}: {chosen.get('key') or chosen['precision']} on {chosen['backend']}",
        "",
        f"Kiln job {job.id} measured this variant on {agent.get('name') or device['target']}:",
        f"p50 {latency.get('p50', float('nan')):.3f} ms, p99 {latency.get('p99', float('nan')):.3f} ms, "
        f"{accuracy.get('metric')} {accuracy.get('value')} (drop {accuracy.get('drop')}).",
        "",
        f"Why this one: {device['reason']}",
        "",
        "- `model.onnx`: the variant (runs on ONNX Runtime; OpenVINO reads it too).",
        "- `compiled/`: the engine the device built from it, when the agent uploaded one.",
        "- `report.json`: every variant measured on this device.",
        "- `run.py`: `python run.py your-inputs.npz` times the model here.",
        "",
    ])


def build_device_package(*, job, device: dict, out_path: Path) -> bool:
    """Write the package of one device's recommended variant; False when nothing was recommended."""
    chosen = next((v for v in device["variants"] if v["id"] == device["recommended"]), None)
    if chosen is None or not chosen.get("variant_artifact"):
        return False
    variant_artifact = Artifact.objects.select_related("blob").get(pk=chosen["variant_artifact"]["id"])
    with zipfile.ZipFile(out_path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.write(blob_file(variant_artifact.blob), "model.onnx")
        compiled = chosen.get("artifact")
        if compiled and compiled["id"] != variant_artifact.id:
            compiled_artifact = Artifact.objects.select_related("blob").get(pk=compiled["id"])
            archive.write(blob_file(compiled_artifact.blob), f"compiled/{compiled_artifact.name}")
        archive.writestr("report.json", json.dumps({"job": job.id, "tolerance": job.tolerance, **device}, indent=2, default=str))
        archive.writestr("run.py", RUN_SCRIPT)
        archive.writestr("README.md", _readme(job, device, chosen))
    return True
