"""The decision is one typed object under one name, whatever era of report it is read from."""
from __future__ import annotations

from kiln.reports.selectors import device_json, stored_decision
from tests.platform.openapi_contract import check_component

ROW = {"family": "fp16", "variants": 1, "variant": 4, "label": "fp16 on onnxruntime", "p50_ms": 1.2, "drop": 0.0, "metric": "cosine",
       "outcome": "tie", "why": "a tie on speed"}


def test_a_report_stored_before_decisions_answers_its_verdict_as_a_complete_decision():
    legacy = {"verdict": {"variant": 3, "label": "fp32 on onnxruntime", "text": "Use fp32 on onnxruntime.", "tie": True,
                          "accuracy": {"metric": "cosine", "value": 1.0, "drop": 0.0}, "speedup": None},
              "alternatives": [ROW], "unstable": [{"text": "1 of 2 first-pass benchmarks were unstable."}]}
    decision = stored_decision(legacy)
    check_component(decision, "Decision")
    assert decision["text"] == "Use fp32 on onnxruntime." and decision["tie"] and decision["alternatives"] == [ROW]
    assert decision["noise"] == {"text": "1 of 2 first-pass benchmarks were unstable."} and decision["provisional"] is None


def test_a_stored_decision_without_the_keys_added_since_gets_them_empty():
    decision = stored_decision({"decision": {"variant": None, "text": "No variant was measured successfully on this device.",
                                             "alternatives": [ROW], "noise": {"text": ""}}})
    check_component(decision, "Decision")
    assert decision["measurement"] is None and decision["tied_with"] == [] and decision["comparison"] is None


def test_a_device_tells_the_decision_once():
    device = device_json(agent=None, target="agent:1", variants=[], recommended=None, reason="No variant was measured.", final=False,
                         details={"decision": {"text": "No variant was measured.", "alternatives": [ROW], "noise": {"text": "busy"}}})
    check_component(device, "ReportDevice")
    assert device["decision"]["alternatives"] == [ROW] and not {"verdict", "alternatives", "noise", "measurement"} & set(device)
