"""The integer types Kiln's search gives ONNX Runtime INT8 on this CPU (workers.quantize.schemes.ort_int8_scheme).

Without integer dot products (AVX2 only, AVX-512 without VNNI) ONNX Runtime's u8×s8 kernels saturate in vpmaddubsw
unless the weights use 7 bits, so the search builds with `reduce_range` there. A test that compares what ONNX Runtime
runs with a simulation of the quantized graph builds the way the search would on the CPU it runs on: with 8-bit weights
on an AVX2-only CPU, ONNX Runtime's saturated sums differ from exact integer arithmetic (CI on an AVX2 EPYC, 2026-12-06:
the student's gap to ONNX Runtime was as large as the quantization's own).
"""
from __future__ import annotations

from devices.agent.capabilities import cpu_isa
from workers.quantize.schemes import build_options, ort_int8_scheme

THIS_CPU = build_options(ort_int8_scheme(cpu_isa()))
