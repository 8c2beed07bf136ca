import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devices.agent.capabilities import collect_capabilities, parse_cpuinfo
from tests.fixtures.cpuinfo import GRAVITON3

REPO = Path(__file__).resolve().parents[2]

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512_vnni avx512_bf16 amx_tile amx_int8 amx_bf16

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512_vnni avx512_bf16 amx_tile amx_int8 amx_bf16
"""


def test_parse_cpuinfo_finds_the_model_and_isa_flags():
    model, isa = parse_cpuinfo(CPUINFO)
    assert model == "Intel(R) Xeon(R) Platinum 8480+"
    for flag in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx"):
        assert flag in isa
    assert "fpu" not in isa


def test_parse_cpuinfo_without_amx_does_not_claim_it():
    _, isa = parse_cpuinfo("model name : Old\nflags : sse4_2 avx avx2\n")
    assert isa == ["sse4_2", "avx", "avx2"]


def test_parse_cpuinfo_reads_arm_features():
    _, isa = parse_cpuinfo("Features\t: fp asimd asimddp sve i8mm\n")
    assert {"asimd", "asimddp", "sve", "i8mm"} <= set(isa)


def test_parse_cpuinfo_reports_arm_dot_products_bf16_and_fp16():
    _, isa = parse_cpuinfo(GRAVITON3)
    assert {"asimddp", "i8mm", "svei8mm", "bf16", "svebf16", "fphp", "asimdhp", "sve"} <= set(isa)
    assert not {"aes", "sha3", "evtstrm"} & set(isa)


def test_parse_cpuinfo_reports_x86_vnni_amx_bf16_and_fp16():
    _, isa = parse_cpuinfo("model name : Xeon\nflags : fpu avx2 avx_vnni avx_vnni_int8 avx512_vnni avx512_bf16 avx512_fp16 "
                           "amx_tile amx_int8 amx_bf16 amx_fp16\n")
    assert {"avx_vnni", "avx_vnni_int8", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_int8", "amx_bf16", "amx_fp16"} <= set(isa)


def test_every_flag_the_family_decision_reads_is_reported():
    """What the search decides from (workers.quantize.isa_families) must survive the agent's filter, on x86 and Arm."""
    from workers.quantize.isa_families import ALIASES, DECISION_FLAGS

    wanted = [flag for flag in DECISION_FLAGS if flag not in ALIASES and flag != "amx"]
    _, isa = parse_cpuinfo("flags : " + " ".join(wanted) + "\n")
    assert sorted(set(wanted) - set(isa)) == []
    assert "amx" in isa  # the agent's summary of any AMX flag


def test_capabilities_have_the_protocol_shape(monkeypatch):
    monkeypatch.delenv("KILN_AGENT_BACKENDS", raising=False)
    capabilities = collect_capabilities()
    assert {"os", "arch", "cpu_model", "cores", "isa", "memory_mb", "gpu", "runtimes",
            "agent_version"} <= set(capabilities)
    assert isinstance(capabilities["cores"], int) and capabilities["cores"] >= 1
    assert isinstance(capabilities["memory_mb"], int) and capabilities["memory_mb"] > 0
    assert isinstance(capabilities["isa"], list)
    assert capabilities["gpu"] is None or isinstance(capabilities["gpu"], dict)
    assert capabilities["runtimes"]["onnxruntime"]
    json.dumps(capabilities)


def test_capabilities_honour_the_backend_restriction(monkeypatch):
    monkeypatch.setenv("KILN_AGENT_BACKENDS", "onnxruntime")
    assert set(collect_capabilities()["runtimes"]) == {"onnxruntime"}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to confine an agent to one of them")
def test_an_agent_confined_to_one_cpu_reports_one_core_and_runs_one_thread():
    """An agent started under `taskset -c N` (or in a one-CPU cpuset container) reports one core, so the search does
    not propose a second thread, and its ONNX Runtime sessions default to one intra-op thread."""
    script = ("import json, os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))});"
              "from devices.agent.capabilities import collect_capabilities;"
              "from benchmarks.local_search import host_thread_choices;"
              "c = collect_capabilities(); print(json.dumps([c['cores'], c['logical_cores'], host_thread_choices()]))")
    output = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True, timeout=120,
                            env={**os.environ, "KILN_AGENT_BACKENDS": "onnxruntime",
                                 "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "platform")])})
    assert json.loads(output.stdout.strip().splitlines()[-1]) == [1, 1, [1]]
    # The machine's counts where nothing is confined.
    assert collect_capabilities()["logical_cores"] == len(os.sched_getaffinity(0))
