"""`kiln report`'s table in an 80-column terminal: names whole, the recommended row findable."""
from __future__ import annotations

import io

from rich.console import Console

from kiln_client.cli import RECOMMENDED, report_table

KEYS = ["fp32", "fp32+threads4", "int8-percentile-keep3+threads4", "int8-dynamic-keep1", "int4-weight"]


def device() -> dict:
    variants = [
        {"id": index, "key": key, "precision": key.split("-")[0].split("+")[0], "backend": "onnxruntime" if index % 2 else "openvino",
         "latency_ms": {"p50": 12.3456 / (index + 1), "p99": 14.0}, "regression": {"flagged": index == 3, "slowdown": 1.31},
         "accuracy": {"metric": "top1_agreement", "value": 0.98 - index * 0.01, "drop": index * 0.01, "within_tolerance": index < 3}}
        for index, key in enumerate(KEYS)
    ]
    return {"agent": {"name": "jetson-orin-nano-lab-bench-2"}, "variants": variants, "recommended": 2}


def rendered(width: int) -> str:
    buffer = io.StringIO()
    Console(file=buffer, width=width, color_system=None).print(report_table(device(), 7, width))
    return buffer.getvalue()


def test_at_80_columns_every_variant_name_is_whole_and_the_star_marks_the_recommended_one():
    text = rendered(80)
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert "…" not in text
    for key in KEYS:
        assert any(key in line for line in lines), key
    [starred] = [line for line in lines if line.lstrip().startswith(RECOMMENDED)]  # the caption says "recommended: ★"
    assert "int8-percentile-keep3+threads4" in starred and starred.rstrip().endswith("yes")
    assert "p99 ms" not in text  # the column that goes first when the terminal is narrow


def test_a_wide_terminal_also_shows_the_p99_and_the_regression():
    text = rendered(140)
    assert "p99 ms" in text and "1.31x slower" in text
