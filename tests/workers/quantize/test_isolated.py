"""Builds in their own process: results and errors cross back as JSON, and a build over the memory budget is stopped by name."""

from __future__ import annotations

import onnx
import pytest

from workers.host_memory import build_memory_mb as memory_budget_mb
from workers.quantize import NotApplicable
from workers.quantize.isolated import BuildMemoryExceeded, build_isolated
from workers.quantize.variants import build_variant


def test_an_isolated_build_matches_the_in_process_one_and_reports_its_peak_memory(mlp_files, tmp_path):
    options = {"calibration_method": "minmax", "per_channel": False}
    isolated = build_isolated(model_path=mlp_files.model, precision="int8", out_path=tmp_path / "a.onnx",
                              calibration_path=mlp_files.calibration, options=options)
    direct = build_variant(model_path=mlp_files.model, precision="int8", out_path=tmp_path / "b.onnx",
                           calibration_path=mlp_files.calibration, options=options)
    assert isolated["recipe"] == direct["recipe"] and isolated["backends"] == direct["backends"]
    onnx.checker.check_model(str(tmp_path / "a.onnx"))
    assert 50 < isolated["peak_rss_mb"] < memory_budget_mb()
    assert isolated["build_s"] > 0


def test_a_build_over_the_memory_budget_fails_naming_the_budget_and_leaves_no_artifact(mlp_files, tmp_path):
    # Importing the quantization toolchain alone takes a few hundred MB: 300 MB cannot hold a build.
    with pytest.raises(BuildMemoryExceeded, match=r"build memory budget of 300 MB \(KILN_BUILD_MEMORY_MB\)"):
        build_isolated(model_path=mlp_files.model, precision="int8", out_path=tmp_path / "big.onnx",
                       calibration_path=mlp_files.calibration, memory_budget=300)
    assert not (tmp_path / "big.onnx").exists()


def test_the_build_errors_cross_the_process_boundary_as_the_same_types(tmp_path):
    from tests.devices.conftest import build_tiny_cnn

    path = tmp_path / "cnn.onnx"
    model = build_tiny_cnn()
    # No MatMul weight at all: INT4 weights are not applicable.
    model.graph.node[3].op_type = "Add"
    onnx.save(model, str(path))
    with pytest.raises(NotApplicable):
        build_isolated(model_path=path, precision="int4-weight", out_path=tmp_path / "int4.onnx")
    with pytest.raises(ValueError, match="unknown option"):
        build_isolated(model_path=path, precision="fp32", out_path=tmp_path / "fp32.onnx", options={"bogus": 1})


def test_the_budget_setting_is_checked(monkeypatch):
    monkeypatch.delenv("KILN_BUILD_MEMORY_MB", raising=False)
    assert memory_budget_mb() == 4096
    monkeypatch.setenv("KILN_BUILD_MEMORY_MB", "2048")
    assert memory_budget_mb() == 2048
    for bad in ("lots", "100"):
        monkeypatch.setenv("KILN_BUILD_MEMORY_MB", bad)
        with pytest.raises(ValueError, match="KILN_BUILD_MEMORY_MB must"):
            memory_budget_mb()


def test_a_build_pauses_while_an_agent_of_this_host_times_and_the_pause_is_not_held_against_its_time_limit(mlp_files, tmp_path, monkeypatch):
    import threading
    import time

    from devices import quiet

    monkeypatch.setenv(quiet.QUIET_DIR_ENV, str(tmp_path / "quiet"))
    held = threading.Event()
    release = threading.Event()

    def agent_times() -> None:
        with quiet.QuietWindow(wait_for_builds_s=30):
            held.set()
            release.wait(30)

    agent = threading.Thread(target=agent_times)
    agent.start()
    held.wait(10)
    result = {}

    def build() -> None:
        try:
            result["built"] = build_isolated(model_path=mlp_files.model, precision="int8", out_path=tmp_path / "p.onnx",
                                             calibration_path=mlp_files.calibration, timeout_s=60)
        except Exception as error:  # the assertion below names it
            result["error"] = error

    builder = threading.Thread(target=build)
    builder.start()
    # The window outlasts what the build would need; the build waits it out, stopped, without being charged for it.
    time.sleep(3.0)
    import psutil

    # The build is a sandboxed child (workers.sandbox.child) and the process it forked into its own PID namespace.
    children = [child for child in psutil.Process().children(recursive=True) if "workers.sandbox.child" in " ".join(child.cmdline())]
    assert children and all(child.status() == psutil.STATUS_STOPPED for child in children)
    assert builder.is_alive() and not (tmp_path / "p.onnx").exists()
    release.set()
    agent.join(10)
    builder.join(120)
    assert "error" not in result, result.get("error")
    assert (tmp_path / "p.onnx").exists() and result["built"]["build_s"] >= 3.0


def test_a_build_that_runs_past_its_limit_is_stopped(mlp_files, tmp_path):
    with pytest.raises(TimeoutError, match="took longer than 0 s"):
        build_isolated(model_path=mlp_files.model, precision="int8", out_path=tmp_path / "t.onnx",
                       calibration_path=mlp_files.calibration, timeout_s=0.2)
