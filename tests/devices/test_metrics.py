import math

import numpy as np
import pytest

from devices import metrics


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


def test_compare_outputs_reports_the_worst_output_and_each_output():
    reference = {"logits": REF, "embedding": np.ones((3, 4))}
    outputs = {"logits": OUT, "embedding": np.ones((3, 4)) + 0.1, "extra": np.zeros(1)}
    result = metrics.compare_outputs(outputs, reference, labels=np.array([1, 0, 1]))
    logits = result["outputs"]["logits"]
    embedding = result["outputs"]["embedding"]
    assert embedding["sqnr_db"] == pytest.approx(20.0)
    assert result["sqnr_db"] == min(logits["sqnr_db"], embedding["sqnr_db"])
    assert result["cosine"] == min(logits["cosine"], embedding["cosine"])
    assert result["max_abs_error"] == pytest.approx(max(logits["max_abs_error"], 0.1))
    assert result["top1_agreement"] == pytest.approx(2 / 3)
    assert result["accuracy"] == pytest.approx(1.0)
    assert result["reference_accuracy"] == pytest.approx(2 / 3)
    assert result["labeled_output"] == "logits"
    assert result["samples"] == 3
    assert set(result["outputs"]) == {"logits", "embedding"}


def test_compare_outputs_without_labels_has_no_accuracy():
    result = metrics.compare_outputs({"y": OUT}, {"y": OUT})
    assert result["accuracy"] is None and result["reference_accuracy"] is None
    assert result["cosine"] == pytest.approx(1.0)
    assert result["top1_agreement"] == 1.0 and result["top5_agreement"] == 1.0


def test_compare_outputs_requires_every_reference_output():
    with pytest.raises(ValueError, match="logits"):
        metrics.compare_outputs({"other": OUT}, {"logits": REF})


def test_metrics_module_imports_numpy_only():
    import ast
    from pathlib import Path

    tree = ast.parse(Path(metrics.__file__).read_text())
    imported = {
        (node.module if isinstance(node, ast.ImportFrom) else alias.name).split(".")[0]
        for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert imported <= {"__future__", "collections", "math", "typing", "numpy"}
