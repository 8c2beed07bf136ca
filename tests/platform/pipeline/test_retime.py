"""Which variants a device re-times side by side: every variant within tolerance that could win, and FP32 per backend."""
from __future__ import annotations

from kiln.pipeline.retime import MAX_FINALISTS, finalists


def entry(id, key, p50, within=True, backend="onnxruntime", precision="fp32", compile=None):
    return {"id": id, "key": key, "precision": precision, "backend": backend, "compile": compile or {}, "latency_ms": {"p50": p50},
            "accuracy": {"value": 1.0, "within_tolerance": within}}


def test_the_finalists_are_the_fastest_within_tolerance_plus_fp32_with_runtime_defaults_on_each_backend():
    entries = [entry(1, "fp32", 10.0), entry(2, "fp32", 12.0, backend="openvino"), entry(3, "int8", 3.0, precision="int8"),
               entry(4, "int4", 2.0, within=False, precision="int4-weight"),
               entry(5, "fp32+ov-bf16", 4.0, backend="openvino", compile={"inference_precision": "bf16"}),
               *[entry(10 + n, f"int8-{n}", 5.0 + n, precision="int8") for n in range(10)]]
    chosen = finalists(entries)
    ids = [e["id"] for e in chosen]
    # Outside the tolerance never; bf16 is not an FP32 reference; FP32 of each backend always; then the fastest, at most 8 in all.
    assert 4 not in ids and {1, 2} <= set(ids) and len(chosen) == MAX_FINALISTS
    assert ids == sorted(ids, key=lambda i: next(e["latency_ms"]["p50"] for e in entries if e["id"] == i))
    assert 3 in ids and 5 in ids and 19 not in ids


def test_one_candidate_alone_is_not_re_timed():
    assert finalists([entry(1, "fp32", 10.0), entry(2, "int8", 3.0, within=False, precision="int8")]) == []
