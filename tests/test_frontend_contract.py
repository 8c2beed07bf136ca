"""The UI's own copies of the contract's vocabularies (frontend/src: the output kinds' figures, what a job may declare)
hold what kiln_contract/contract.py holds: a kind or a declarable metric the contract gains cannot go missing from the
pickers. (OutputKind itself comes from the API schema, which tsc checks every Record<OutputKind, …> against.)"""
from __future__ import annotations

import re
from pathlib import Path

from kiln_contract import contract

FRONTEND = Path(__file__).resolve().parent.parent / "frontend" / "src"


def _block(path: Path, name: str) -> str:
    text = path.read_text()
    start = text.index(f"{name}")
    return text[start:text.index("\n}", start) if "= {" in text[start:start + 200] else text.index("] as const", start)]


def test_the_declarable_metrics_the_form_offers_are_the_contracts_in_its_order():
    offered = re.findall(r"'(\w+)'", _block(FRONTEND / "api" / "types.ts", "export const DECLARED_METRIC_KINDS"))
    assert offered == list(contract.DECLARABLE)


def test_each_declared_metric_reads_the_figure_the_contract_says():
    pairs = dict(re.findall(r"(\w+): '(\w+)'", _block(FRONTEND / "components" / "outputKinds.ts", "const DECLARED_FIGURES")))
    assert pairs == contract.DECLARABLE


def test_every_output_kind_has_a_label_and_auto_reads_its_kinds_primary_figure():
    source = FRONTEND / "components" / "outputKinds.ts"
    labelled = re.findall(r"^  (\w+): \{ label: ", _block(source, "export const KIND_LABELS"), flags=re.MULTILINE)
    assert labelled == list(contract.OUTPUT_KINDS)
    figures = dict(re.findall(r"^  (\w+): \{ figure: '(\w+)'", _block(source, "const AUTO_FIGURES"), flags=re.MULTILINE))
    assert figures == {kind: primary for kind, (primary, _all) in contract.KIND_METRICS.items()}
