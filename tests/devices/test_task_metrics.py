"""Heat maps, distributions over bins and embeddings judged by what users do with them: on each kind, data where the
old proxy (mask IoU, relative L2) and the task-level metric disagree, and the inference that picks the kind."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from kiln_contract import contract, metrics
from workers.inspect import infer_output_kinds

TOLERANCE = {"metric": "auto", "max_drop": 0.01}


def _verdict(kind: str, output: np.ndarray, reference: np.ndarray, **options) -> dict:
    plan = contract.evaluation_plan(output_kinds={"y": {"kind": kind, **options}}, output_order=["y"], declared=[], has_labels=False)
    return contract.score_accuracy(TOLERANCE, metrics.evaluate({"y": output}, {"y": reference}, plan))


def _text_page() -> np.ndarray:
    """A [1, 1, 64, 64] map: a large text block and a small one (a short word) the threshold makes regions of."""
    page = np.full((1, 1, 64, 64), 0.05)
    page[0, 0, 8:40, 4:60] = 0.9
    page[0, 0, 50:53, 10:15] = 0.8
    return page


def test_a_heat_map_that_loses_a_small_region_keeps_its_mask_iou_but_not_its_regions():
    reference = _text_page()
    lost = reference.copy()
    lost[0, 0, 50:53, 10:15] = 0.3
    assert metrics.mask_iou(lost, reference) > 0.98  # the old proxy: within 1%
    figures = metrics.region_agreement(lost, reference)
    assert figures["region_recall"] == 0.5 and figures["region_f1"] == pytest.approx(2 / 3)
    verdict = _verdict("heat_map", lost, reference)
    assert verdict["metric"] == "region_f1" and not verdict["within_tolerance"]
    assert _verdict("probability_map", lost, reference)["within_tolerance"]


def test_a_heat_map_whose_regions_merge_or_split_is_a_miss_and_a_shifted_peak_is_seen():
    reference = np.zeros((1, 1, 40, 40))
    reference[0, 0, 5:15, 5:15] = 0.9
    reference[0, 0, 5:15, 17:27] = 0.9
    reference[0, 0, 10, 10] = 1.0
    merged = reference.copy()
    merged[0, 0, 5:15, 15:17] = 0.7
    assert metrics.mask_iou(merged, reference) > 0.9
    assert metrics.region_agreement(merged, reference)["region_f1"] == 0.0
    moved = reference.copy()
    moved[0, 0, 10, 10], moved[0, 0, 10, 25] = 0.9, 1.0
    assert metrics.heat_map_peak_agreement(moved, reference) == 0.0
    assert metrics.heat_map_peak_agreement(reference, reference) == 1.0


def test_regions_are_four_connected_areas():
    foreground = np.array([[1, 1, 0, 1],
                           [0, 1, 0, 1],
                           [1, 0, 0, 0],
                           [1, 1, 0, 1]], dtype=bool)
    labels, count = metrics.connected_regions(foreground)
    assert count == 4
    assert len({labels[0, 0], labels[1, 1]}) == 1 and labels[2, 0] == labels[3, 1] != labels[0, 0]
    assert (labels == 0).sum() == (~foreground).sum()


def _pitch_rows(centres: np.ndarray, bins: int = 360, width: float = 1.25) -> np.ndarray:
    """CREPE-like rows: a Gaussian bump over ordered bins around each (fractional) centre, Sigmoid-like values."""
    index = np.arange(bins)[None, :]
    return np.exp(-0.5 * ((index - centres[:, None]) / width) ** 2) * 0.95


def test_a_distribution_whose_decoded_value_moves_keeps_its_mask_and_argmax_but_not_its_answer():
    centres = 40.0 + 11 * np.arange(24)
    reference = _pitch_rows(centres)
    # Mass moved to bins below the peak, kept under 0.5: the same bins are over 0.5 and the argmax stays, the decoded
    # pitch drops by most of a bin (16 cents on CREPE's scale).
    skewed = reference.copy()
    rows = np.arange(len(centres))
    peaks = np.argmax(reference, axis=1)
    skewed[rows, peaks - 3] += 0.44
    skewed[rows, peaks - 4] += 0.44
    assert metrics.mask_iou(skewed, reference) == 1.0
    figures = metrics.distribution_agreement(skewed, reference)
    assert figures["peak_agreement"] == 1.0 and figures["decoded_agreement"] == 0.0 and figures["decoded_error_bins"] > 0.5
    verdict = _verdict("distribution", skewed, reference)
    assert verdict["metric"] == "decoded_agreement" and not verdict["within_tolerance"]
    assert _verdict("probability_map", skewed, reference)["within_tolerance"]


def test_a_distribution_with_a_noisy_floor_keeps_its_answer_though_its_error_is_large():
    rng = np.random.default_rng(0)
    reference = _pitch_rows(np.linspace(40, 300, 24))
    # What INT8 does to the 355 bins far from the peak: small errors that relative L2 and SQNR add up.
    noisy = reference + np.abs(rng.normal(0, 0.03, reference.shape))
    assert metrics.relative_l2(noisy, reference) > 0.1
    assert metrics.distribution_agreement(noisy, reference)["decoded_agreement"] == 1.0
    assert _verdict("distribution", noisy, reference)["within_tolerance"]


def test_unclear_rows_of_a_distribution_do_not_count():
    reference = np.vstack([_pitch_rows(np.array([100.0, 200.0])), np.full((2, 360), 0.02)])
    scrambled = reference.copy()
    scrambled[2:] = np.random.default_rng(1).uniform(0, 0.04, (2, 360))
    figures = metrics.distribution_agreement(scrambled, reference)
    assert figures["rows_judged"] == 2 and figures["decoded_agreement"] == 1.0


def _unit(array: np.ndarray) -> np.ndarray:
    return array / np.linalg.norm(array, axis=-1, keepdims=True)


def test_an_embedding_with_a_small_spread_error_misses_by_relative_l2_but_keeps_its_direction_and_neighbours():
    rng = np.random.default_rng(0)
    # Twelve pairs of close voices: each one's nearest neighbour is its pair.
    centres = _unit(rng.standard_normal((12, 256)))
    reference = _unit(np.repeat(centres, 2, axis=0) + 0.5 * rng.standard_normal((24, 256)) / 16)
    # bf16-like: every value off by a few percent of its size.
    output = reference * (1 + 0.05 * rng.standard_normal(reference.shape))
    assert metrics.relative_l2(output, reference) > 0.03
    assert metrics.neighbour_agreement(output, reference) == 1.0
    assert _verdict("embedding", output, reference)["within_tolerance"]
    assert not _verdict("regression", output, reference)["within_tolerance"]
    # Swapping who is near whom is what a downstream classifier feels.
    shuffled = reference[rng.permutation(len(reference))]
    assert metrics.neighbour_agreement(shuffled, reference) < 0.5


def _single_output_model(nodes, shape):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", *shape[1:]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_one_channel_sigmoid_map_is_a_heat_map_and_a_many_channel_one_a_probability_map():
    one = _single_output_model([helper.make_node("Sigmoid", ["x"], ["y"])], ["N", 1, 32, 32])
    kind = infer_output_kinds(one)["y"]
    assert kind["kind"] == "heat_map" and "regions" in kind["reason"]
    many = _single_output_model([helper.make_node("Sigmoid", ["x"], ["y"])], ["N", 3, 32, 32])
    assert infer_output_kinds(many)["y"]["kind"] == "probability_map"


def test_sigmoid_bins_whose_rows_peak_smoothly_are_a_distribution_and_independent_labels_are_not():
    model = _single_output_model([helper.make_node("Sigmoid", ["x"], ["y"])], ["N", 360])
    assert infer_output_kinds(model)["y"]["kind"] == "probability_map"
    inferred = infer_output_kinds(model, {"y": _pitch_rows(np.linspace(40, 300, 8))})["y"]
    assert inferred["kind"] == "distribution" and inferred["source"] == "reference" and "decoded" in inferred["reason"]
    labels = (np.random.default_rng(0).uniform(size=(8, 360)) > 0.97) * 0.9 + 0.02
    assert infer_output_kinds(model, {"y": labels})["y"]["kind"] == "probability_map"


def test_vectors_of_unit_length_are_embeddings_whatever_the_graph_calls_them():
    nodes = [helper.make_node("Mul", ["x", "x"], ["square"]), helper.make_node("ReduceSum", ["square"], ["total"], keepdims=1),
             helper.make_node("Sqrt", ["total"], ["norm"]), helper.make_node("Div", ["x", "norm"], ["y"])]
    model = _single_output_model(nodes, ["N", 64])
    assert infer_output_kinds(model)["y"]["kind"] == "regression"
    vectors = _unit(np.random.default_rng(0).standard_normal((5, 64)))
    inferred = infer_output_kinds(model, {"y": vectors})["y"]
    assert inferred["kind"] == "embedding" and inferred["source"] == "reference" and "norm 1" in inferred["reason"]


def test_a_declared_region_metric_judges_a_probability_map_by_its_regions():
    reference = _text_page()
    lost = reference.copy()
    lost[0, 0, 50:53, 10:15] = 0.3
    declared = contract.parse_declared_metrics([{"output": "y", "kind": "regions", "primary": True, "threshold": 0.4}], outputs=["y"])
    plan = contract.evaluation_plan(output_kinds={"y": {"kind": "probability_map"}}, output_order=["y"], declared=declared,
                                    has_labels=False)
    verdict = contract.score_accuracy(TOLERANCE, metrics.evaluate({"y": lost}, {"y": reference}, plan))
    assert verdict["metric"] == "region_f1" and verdict["value"] == pytest.approx(2 / 3) and not verdict["within_tolerance"]
