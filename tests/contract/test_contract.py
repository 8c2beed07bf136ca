"""The accuracy contract: tolerances, declared metrics, the evaluation plan and the verdict."""
from __future__ import annotations

import pytest

from kiln_contract import contract
from tests.imports_of import packages_imported


def test_tolerance_forms_normalize_to_one_shape():
    assert contract.parse_tolerance(None) == {"metric": "auto", "max_drop": 0.01}
    assert contract.parse_tolerance("1%") == {"metric": "auto", "max_drop": 0.01}
    assert contract.parse_tolerance("cosine:0.5%") == {"metric": "cosine", "max_drop": 0.005}
    assert contract.parse_tolerance({"metric": "sqnr"}) == {"metric": "sqnr", "min_value": 30.0}
    assert contract.parse_tolerance({"metric": "mask_iou", "max_drop": 0.02}) == {"metric": "mask_iou", "max_drop": 0.02}


@pytest.mark.parametrize("raw, message", [
    ({"metric": "bleu"}, "Unknown tolerance metric"),
    ({"max_drop": 2}, "between 0 and 1"),
    ({"max_drop": "1e400"}, "finite"),
    ({"max_drop": "9" * 5000}, "must be a number"),
    ({"max_drop": True}, "must be a number"),
    ([1], "must be an object"),
])
def test_bad_tolerances_say_what_is_wrong(raw, message):
    with pytest.raises(contract.InvalidSpec, match=message):
        contract.parse_tolerance(raw)


def test_declared_metrics_are_checked_against_the_outputs():
    parsed = contract.parse_declared_metrics([{"output": "maps", "kind": "mask_iou", "threshold": 0.3, "primary": True},
                                              {"output": "text", "kind": "ctc", "blank": 0}], outputs=["maps", "text"])
    assert parsed == [{"output": "maps", "kind": "mask_iou", "primary": True, "threshold": 0.3},
                      {"output": "text", "kind": "ctc", "primary": False, "blank": 0}]


@pytest.mark.parametrize("item, code, message", [
    ({"output": "nope", "kind": "mask_iou"}, "unknown_output", "no output 'nope'"),
    ({"output": "maps", "kind": "mask_iou", "threshold": 1.5}, "invalid_metrics", "between 0 and 1"),
    ({"output": "maps", "kind": "mask_iou", "threshold": 0}, "invalid_metrics", "strictly between"),
    ({"output": "maps", "kind": "ctc"}, "invalid_metrics", "blank index"),
    ({"output": "maps", "kind": "plugin", "plugin": "../x"}, "invalid_metrics", "entry point"),
    ({"output": "maps", "kind": "top1_agreement", "threshold": 0.2}, "invalid_metrics", "takes no threshold"),
    ({"output": "maps", "kind": "wer"}, "invalid_metrics", "unknown metric kind"),
])
def test_bad_declared_metrics_are_refused_with_a_code(item, code, message):
    with pytest.raises(contract.InvalidSpec, match=message) as raised:
        contract.parse_declared_metrics([item], outputs=["maps"])
    assert raised.value.code == code


def test_the_first_output_is_primary_unless_the_job_declares_one():
    kinds = {"boxes": {"kind": "detection", "layout": "channels_first", "reason": "r"}, "aux": {"kind": "dense"}}
    plan = contract.evaluation_plan(output_kinds=kinds, output_order=["boxes", "aux"], declared=[], has_labels=False)
    assert [(o["name"], o["primary"]) for o in plan["outputs"]] == [("boxes", True), ("aux", False)]
    assert plan["outputs"][0]["options"] == {"layout": "channels_first"}
    declared = [{"output": "aux", "kind": "relative_l2", "primary": True}]
    plan = contract.evaluation_plan(output_kinds=kinds, output_order=["boxes", "aux"], declared=declared, has_labels=False)
    assert [(o["name"], o["primary"]) for o in plan["outputs"]] == [("boxes", False), ("aux", True)]


def test_every_primary_output_must_be_within_and_the_worst_is_shown():
    accuracy = {"outputs": {
        "a": {"primary": True, "primary_metric": "mask_iou", "metrics": {"mask_iou": 0.995}, "reference": {}, "errors": {}},
        "b": {"primary": True, "primary_metric": "relative_l2", "metrics": {"relative_l2": 0.03}, "reference": {}, "errors": {}},
    }}
    verdict = contract.score_accuracy({"metric": "auto", "max_drop": 0.01}, accuracy)
    assert verdict["within_tolerance"] is False
    assert verdict["output"] == "b" and verdict["metric"] == "relative_l2" and verdict["drop"] == pytest.approx(0.03)
    assert contract.score_accuracy({"metric": "auto", "max_drop": 0.05}, accuracy)["within_tolerance"] is True


def test_label_figures_drop_from_fp32s_own_value_and_sqnr_is_a_floor():
    accuracy = {"outputs": {"y": {"primary": True, "primary_metric": "top1_accuracy", "metrics": {"top1_accuracy": 0.97, "sqnr_db": 31.0},
                                  "reference": {"top1_accuracy": 0.985}, "errors": {}}}}
    verdict = contract.score_accuracy({"metric": "accuracy", "max_drop": 0.01}, accuracy)
    assert verdict["drop"] == pytest.approx(0.015) and verdict["within_tolerance"] is False
    assert contract.score_accuracy({"metric": "sqnr", "min_value": 30}, accuracy)["within_tolerance"] is True
    assert contract.score_accuracy({"metric": "sqnr", "min_value": 32}, accuracy)["within_tolerance"] is False


def test_contract_imports_nothing_of_the_server():
    imported = packages_imported(contract.__file__)
    assert imported <= {"__future__", "math", "re", "dataclasses", "typing"}
