import hashlib
import importlib.util
import logging
import threading

import numpy as np
import pytest

from devices.agent.client import AgentClient, RetryPolicy
from devices.agent.runner import (
    LOG_LIMIT_BYTES,
    TaskLogCapture,
    TaskRunner,
    evaluate_outputs,
    load_npz,
    make_feeds,
)
from devices.backends import get_backend

from .conftest import Answer, reference_logits

HAS_OPENVINO = importlib.util.find_spec("openvino") is not None
PROGRESS = "/api/agent/v1/tasks/{}/progress"


@pytest.fixture
def runner(agent_server, tmp_path):
    client = AgentClient(agent_server.url, "kiln_agt_t", sleep=lambda s: None,
                         retry=RetryPolicy(max_attempts=2, base_s=0.0, cap_s=0.0))
    return TaskRunner(client, tmp_path / "work", threads=1)


def _stages(agent_server, task_id):
    return [r.json()["stage"] for r in agent_server.hits("POST", PROGRESS.format(task_id))]


@pytest.mark.parametrize("backend", [
    "onnxruntime",
    pytest.param("openvino", marks=pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed")),
])
def test_task_runs_end_to_end(agent_server, runner, tiny_task_files, backend, tmp_path):
    task = agent_server.serve_task(31, tiny_task_files, attempt=2, backend=backend)
    assert runner.run(task) == "succeeded"

    assert _stages(agent_server, 31) == ["download", "support", "compile", "benchmark", "profile", "evaluate", "upload"]
    upload = agent_server.hits("POST", "/api/agent/v1/tasks/31/artifact")[0]
    assert upload.json()["attempt"] == 2 and agent_server.tus.uploads[upload.json()["upload"]]["data"]
    [result] = agent_server.results(31)
    assert result["attempt"] == 2 and result["status"] == "succeeded" and result["error"] is None
    speed = result["metrics"]
    assert [row["batch_size"] for row in speed["by_batch"]] == [1, 2]
    assert {"p50", "p90", "p99", "mean", "std", "cv"} <= set(speed["latency_ms"])
    assert speed["load_ms"] > 0 and speed["first_inference_ms"] > 0 and speed["peak_memory_mb"] > 0
    assert speed["threads"] == 1 and speed["size_bytes"] > 0
    # Another runtime than ONNX Runtime is checked against it on the same file before anything is judged.
    if backend == "openvino":
        assert speed["runtime_check"]["against"] == "onnxruntime" and speed["runtime_check"]["fault"] is False
        assert speed["float_precision"] == "fp32"  # an FP32 model runs as built
    else:
        assert "runtime_check" not in speed
    accuracy = result["accuracy"]
    assert accuracy["cosine"] > 0.9999
    assert accuracy["top1_agreement"] == 1.0
    logits = accuracy["outputs"]["logits"]
    assert logits["kind"] == "class_scores" and logits["primary_metric"] == "top1_accuracy"
    assert logits["metrics"]["top1_accuracy"] == pytest.approx(5 / 6)
    assert logits["reference"]["top1_accuracy"] == pytest.approx(5 / 6)
    assert result["profile"]["by_op_type"]
    assert "compiled in" in result["log"]
    # The runtime's own operator-support answer, asked before it compiled, travels with the result.
    assert result["support"]["backend"] == backend and result["support"]["verdict"] == "runs" and sum(result["support"]["native"].values()) >= 3
    assert not list((tmp_path / "work").iterdir())  # the task's scratch directory is gone


def test_sha256_mismatch_is_retried_then_fails_the_task(agent_server, runner, tiny_task_files):
    task = agent_server.serve_task(5, tiny_task_files, sha256_override={"model": "0" * 64})
    assert runner.run(task) == "failed"
    assert len(agent_server.hits("GET", "/api/agent/v1/tasks/5/files/model")) == 3
    [result] = agent_server.results(5)
    actual = hashlib.sha256(tiny_task_files["model"]).hexdigest()
    assert result["status"] == "failed"
    assert result["metrics"] == {}  # an object even on failure: the server's field is not nullable
    assert result["error"] == f"sha256 mismatch for model: expected {'0' * 64} got {actual}"
    assert "sha256 mismatch" in result["log"]
    assert not agent_server.hits("POST", "/api/agent/v1/tasks/5/artifact")


def test_cancel_in_a_progress_answer_stops_without_a_result(agent_server, runner, tiny_task_files):
    task = agent_server.serve_task(6, tiny_task_files)
    agent_server.route("POST", PROGRESS.format(6), lambda request: Answer(
        200, {"cancel": request.json()["stage"] == "benchmark", "lease_expires_at": "x"}))
    assert runner.run(task) == "canceled"
    assert _stages(agent_server, 6) == ["download", "support", "compile", "benchmark"]
    assert agent_server.results(6) == []


def test_cancel_event_aborts_a_running_benchmark(agent_server, runner, tiny_task_files):
    task = agent_server.serve_task(7, tiny_task_files, benchmark={"min_runs": 10**9, "min_seconds": 600})
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    assert runner.run(task, cancel) == "canceled"
    assert agent_server.results(7) == []


def test_stopping_during_benchmark_hands_the_task_back(agent_server, runner, tiny_task_files):
    task = agent_server.serve_task(8, tiny_task_files, benchmark={"min_runs": 10**9, "min_seconds": 600})
    threading.Timer(0.5, runner.stop_event.set).start()
    assert runner.run(task) == "handed_back"
    [result] = agent_server.results(8)
    assert result["status"] == "handed_back" and result["error"] == "agent stopping"


def test_stopping_during_evaluate_finishes_the_task(agent_server, runner, tiny_task_files):
    task = agent_server.serve_task(9, tiny_task_files)

    def progress(request):
        if request.json()["stage"] == "evaluate":
            runner.stop_event.set()
        return Answer(200, {"cancel": False})

    agent_server.route("POST", PROGRESS.format(9), progress)
    assert runner.run(task) == "succeeded"
    assert agent_server.results(9)[0]["status"] == "succeeded"
    assert agent_server.hits("POST", "/api/agent/v1/tasks/9/artifact")


def test_stale_attempt_drops_the_task(agent_server, runner, tiny_task_files):
    task = agent_server.serve_task(10, tiny_task_files)
    agent_server.route("POST", PROGRESS.format(10), Answer(409, {"error": "stale attempt"}))
    assert runner.run(task) == "stale"
    assert agent_server.results(10) == []


def test_a_backend_this_agent_lacks_fails_the_task(agent_server, runner, tiny_task_files, monkeypatch):
    monkeypatch.setenv("KILN_AGENT_BACKENDS", "onnxruntime")
    task = agent_server.serve_task(11, tiny_task_files, backend="openvino")
    assert runner.run(task) == "failed"
    assert "KILN_AGENT_BACKENDS" in agent_server.results(11)[0]["error"]


def test_task_without_validation_data_skips_evaluation(agent_server, runner, tiny_task_files):
    task = agent_server.serve_task(12, {"model": tiny_task_files["model"]})
    assert runner.run(task) == "succeeded"
    [result] = agent_server.results(12)
    assert result["accuracy"] is None and result["metrics"]["latency_ms"]["p50"] > 0
    assert "evaluate" not in _stages(agent_server, 12)


def test_evaluate_with_a_static_batch_pads_the_last_chunk(static_batch_model_path, tmp_path):
    compiled = get_backend("onnxruntime").compile(static_batch_model_path, tmp_path)
    inputs = np.random.default_rng(4).standard_normal((6, 1, 8, 8)).astype(np.float32)
    outputs = evaluate_outputs(compiled, {"input": inputs})
    assert outputs["logits"].shape == (6, 10)
    expected = np.concatenate([
        compiled.run({"input": inputs[:4]})["logits"],
        compiled.run({"input": np.concatenate([inputs[4:], inputs[5:6], inputs[5:6]])})["logits"][:2],
    ])
    np.testing.assert_allclose(outputs["logits"], expected, rtol=1e-6)


def test_evaluate_matches_the_reference(tiny_model_path, tmp_path):
    compiled = get_backend("onnxruntime").compile(tiny_model_path, tmp_path)
    inputs = np.random.default_rng(5).standard_normal((3, 1, 8, 8)).astype(np.float64)  # cast to float32
    outputs = evaluate_outputs(compiled, {"input": inputs})
    np.testing.assert_allclose(outputs["logits"], reference_logits(tiny_model_path, inputs.astype(np.float32)),
                               rtol=1e-4, atol=1e-4)


def test_make_feeds_uses_validation_rows_or_random_data(tiny_model_path, tmp_path):
    compiled = get_backend("onnxruntime").compile(tiny_model_path, tmp_path)
    samples = {"input": np.arange(2 * 64, dtype=np.float64).reshape(2, 1, 8, 8)}
    feeds = make_feeds(compiled.input_specs, 3, samples)
    assert feeds["input"].shape == (3, 1, 8, 8) and feeds["input"].dtype == np.float32
    np.testing.assert_array_equal(feeds["input"][2], feeds["input"][1])  # padded with the last row
    assert make_feeds(compiled.input_specs, 5)["input"].shape == (5, 1, 8, 8)


def test_npz_files_never_unpickle(tmp_path):
    path = tmp_path / "evil.npz"
    np.savez(path, payload=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match="allow_pickle"):
        load_npz(path)


def test_log_capture_keeps_the_last_64_kb_of_its_thread():
    capture = TaskLogCapture(threading.get_ident())
    log = logging.getLogger("devices.test")
    log.addHandler(capture)
    log.setLevel(logging.INFO)
    try:
        for index in range(3000):
            log.info("line %05d %s", index, "x" * 40)
        other = threading.Thread(target=lambda: log.info("from another thread"))
        other.start()
        other.join()
    finally:
        log.removeHandler(capture)
    text = capture.text()
    assert len(text.encode()) <= LOG_LIMIT_BYTES
    assert "line 02999" in text and "line 00000" not in text
    assert "another thread" not in text


@pytest.fixture
def metric_plugins(tmp_path, monkeypatch):
    """A distribution on sys.path declaring two kiln.metrics entry points: one that works, one that raises."""
    (tmp_path / "kiln_test_metrics.py").write_text(
        "import numpy as np\n"
        "def label_hits(output, labels, options):\n"
        "    return float(np.mean(np.argmax(output, axis=-1) == labels))\n"
        "def broken(output, labels, options):\n"
        "    raise RuntimeError('the plugin fell over')\n"
    )
    info = tmp_path / "kiln_test_metrics-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kiln-test-metrics\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[kiln.metrics]\nlabel_hits = kiln_test_metrics:label_hits\nbroken = kiln_test_metrics:broken\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_metric_plugins_run_on_the_agent_and_a_raising_one_is_reported(agent_server, runner, tiny_task_files, metric_plugins):
    task = agent_server.serve_task(41, tiny_task_files)
    task["evaluation"] = {"outputs": [{"name": "logits", "kind": "class_scores", "options": {}, "primary": True, "declared": [
        {"output": "logits", "kind": "plugin", "plugin": "label_hits", "primary": True},
        {"output": "logits", "kind": "plugin", "plugin": "broken", "primary": False},
        {"output": "logits", "kind": "plugin", "plugin": "not_installed", "primary": False},
    ]}], "labels": True, "declared_primary": True}
    assert runner.run(task) == "succeeded"
    [result] = agent_server.results(41)
    logits = result["accuracy"]["outputs"]["logits"]
    # The plugin scores the device's output and FP32's, so the tolerance reads a drop.
    assert logits["primary_metric"] == "plugin:label_hits"
    assert logits["metrics"]["plugin:label_hits"] == pytest.approx(5 / 6) and logits["reference"]["plugin:label_hits"] == pytest.approx(5 / 6)
    assert "the plugin fell over" in logits["errors"]["plugin:broken"]
    assert "not installed on this agent" in logits["errors"]["plugin:not_installed"]
    assert logits["metrics"]["top1_agreement"] == 1.0
    from kiln_contract import contract

    verdict = contract.score_accuracy({"metric": "auto", "max_drop": 0.0}, result["accuracy"])
    assert verdict["within_tolerance"] and verdict["metric"] == "plugin:label_hits"


@pytest.mark.parametrize("backend", [
    "onnxruntime",
    pytest.param("openvino", marks=pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed")),
])
def test_a_task_compiles_with_the_compile_options_the_search_asks_for(agent_server, runner, tiny_task_files, backend):
    task = agent_server.serve_task(41, tiny_task_files, backend=backend)
    task["compile"] = {"static_shapes": {"input": [1, 1, 8, 8]}}
    assert runner.run(task) == "succeeded"
    [result] = agent_server.results(41)
    # Specialised to batch 1: only that batch is benchmarked, and every validation sample is still judged.
    assert [row["batch_size"] for row in result["metrics"]["by_batch"]] == [1]
    assert result["accuracy"]["cosine"] > 0.9999


def test_a_task_with_invalid_compile_options_fails_with_the_reason(agent_server, runner, tiny_task_files):
    task = agent_server.serve_task(42, tiny_task_files)
    task["compile"] = {"threads": -3}
    assert runner.run(task) == "failed"
    [result] = agent_server.results(42)
    assert "compile options are invalid: threads must be an integer" in result["error"]


@pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed")
def test_a_model_the_runtime_cannot_read_fails_at_support_before_any_compile(agent_server, runner, tmp_path):
    """OpenVINO refuses the Loop decoder: the task ends in `support` with OpenVINO's reason, and nothing is compiled."""
    import io

    import onnx

    from tests.fixtures.models import build_loop_decoder

    buffer = io.BytesIO()
    onnx.save(build_loop_decoder(), buffer)
    task = agent_server.serve_task(43, {"model": buffer.getvalue()}, backend="openvino")
    assert runner.run(task) == "failed"
    assert _stages(agent_server, 43) == ["download", "support"]
    [result] = agent_server.results(43)
    assert "OpenVINO" in result["error"] and "cannot read the model" in result["error"] and "Loop 'decoder'" in result["error"]
    assert result["support"]["verdict"] == "cannot_run" and result["support"]["unsupported"] == {"Loop": 1}
    assert "compiled in" not in result["log"]


def _slow_model_bytes() -> bytes:
    """A graph on the tiny CNN's input that does far more work: 30 chained 512x512 MatMuls."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Reshape", ["input", "shape"], ["flat"]), helper.make_node("MatMul", ["flat", "w_in"], ["h0"])]
    initializers = [numpy_helper.from_array(np.array([-1, 64], dtype=np.int64), "shape"),
                    numpy_helper.from_array(rng.standard_normal((64, 512)).astype(np.float32) * 0.05, "w_in")]
    for index in range(30):
        initializers.append(numpy_helper.from_array(rng.standard_normal((512, 512)).astype(np.float32) * 0.05, f"w{index}"))
        nodes.append(helper.make_node("MatMul", [f"h{index}", f"w{index}"], [f"h{index + 1}"]))
    graph = helper.make_graph(nodes, "slow", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 8, 8])],
                              [helper.make_tensor_value_info("h30", TensorProto.FLOAT, ["batch", 512])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_a_retime_task_times_the_finalists_in_quiet_rotated_rounds_until_the_leader_separates(agent_server, runner, tiny_task_files,
                                                                                               tmp_path, monkeypatch):
    from devices import quiet

    monkeypatch.setenv(quiet.QUIET_DIR_ENV, str(tmp_path / "quiet"))
    monkeypatch.setenv(quiet.RETAKES_ENV, "0")  # re-taking busy windows has its own tests; here every round is kept once
    files = {"validation": tiny_task_files["validation"], "retime-7": tiny_task_files["model"], "retime-8": _slow_model_bytes()}
    task = agent_server.serve_task(40, files)
    task["files"] = {"validation": task["files"]["validation"]}
    task["retime"] = {"rounds": 20, "min_rounds": 6, "window": {"warmup_runs": 1, "warmup_seconds": 0.0, "min_runs": 3, "min_seconds": 0.0},
                      "variants": [{"task": 7, "key": "fp32", "backend": "onnxruntime", "compile": {}, "model": task_files_entry(task, files, "retime-7")},
                                   {"task": 8, "key": "slow", "backend": "onnxruntime", "compile": {}, "model": task_files_entry(task, files, "retime-8")}]}
    assert runner.run(task) == "succeeded"
    [result] = agent_server.results(40)
    metrics = result["metrics"]
    rows = {row["task"]: row["interleaved_medians_ms"] for row in metrics["retime"]}
    # The slow graph is many times slower in every round: separated at the first round that may stop.
    assert metrics["stopped"] == "separated" and len(rows[7]) == len(rows[8]) == 6
    assert all(slow > fast for fast, slow in zip(rows[7], rows[8]))
    assert len(metrics["windows"]) == 6 and all(window["before"]["loadavg"] and window["after"]["loadavg"] for window in metrics["windows"])
    assert "interleaved round 6 (at most 20): separated" in [hit.json()["message"] for hit in agent_server.hits("POST", PROGRESS.format(40))]
    # Every figure of a re-timed row comes from those same rounds (issue 33): the summary of all their samples.
    for row in metrics["retime"]:
        latency = row["latency_ms"]
        assert latency["count"] >= 6 * 3 and latency["min"] <= min(row["interleaved_medians_ms"])
        assert latency["min"] <= latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"]
        assert row["batch_size"] == 1 and row["throughput_per_s"] == pytest.approx(1000.0 / latency["mean"])
    assert "quiet_wait" not in metrics


def test_a_retime_task_the_server_sends_after_busy_rounds_waits_for_a_quiet_device_first(agent_server, runner, tiny_task_files, tmp_path,
                                                                                        monkeypatch):
    from devices import quiet

    monkeypatch.setenv(quiet.QUIET_DIR_ENV, str(tmp_path / "quiet"))
    monkeypatch.setenv(quiet.RETAKES_ENV, "0")
    monkeypatch.setenv(quiet.BUSY_CORES_ENV, "1000")  # quiet at the first probe, whatever else this host runs
    files = {"validation": tiny_task_files["validation"], "retime-7": tiny_task_files["model"], "retime-8": _slow_model_bytes()}
    task = agent_server.serve_task(41, files)
    task["files"] = {"validation": task["files"]["validation"]}
    task["retime"] = {"rounds": 6, "min_rounds": 6, "wait_for_quiet_s": 20,
                      "window": {"warmup_runs": 1, "warmup_seconds": 0.0, "min_runs": 3, "min_seconds": 0.0},
                      "variants": [{"task": 7, "key": "fp32", "backend": "onnxruntime", "compile": {}, "model": task_files_entry(task, files, "retime-7")},
                                   {"task": 8, "key": "slow", "backend": "onnxruntime", "compile": {}, "model": task_files_entry(task, files, "retime-8")}]}
    assert runner.run(task) == "succeeded"
    [result] = agent_server.results(41)
    assert result["metrics"]["quiet_wait"]["quiet"] is True and result["metrics"]["quiet_wait"]["waited_s"] < 20
    messages = [hit.json()["message"] for hit in agent_server.hits("POST", PROGRESS.format(41))]
    assert any(message.startswith("waiting up to 20 s for the device to be quiet") for message in messages), messages


def test_a_retime_stops_for_time_once_the_server_says_another_job_came_to_wait(agent_server, runner, tiny_task_files, tmp_path,
                                                                                monkeypatch):
    from devices import quiet
    from devices.agent import runner as runner_module

    monkeypatch.setenv(quiet.QUIET_DIR_ENV, str(tmp_path / "quiet"))
    monkeypatch.setenv(quiet.RETAKES_ENV, "0")
    # Two finalists that never separate nor settle (the rule has its own tests): only the cap or the time can stop them.
    monkeypatch.setattr(runner_module.paired, "stop_reason", lambda medians, *, min_rounds, max_rounds: "cap" if len(medians[0]) >= max_rounds else None)
    files = {"validation": tiny_task_files["validation"], "retime-7": tiny_task_files["model"], "retime-8": tiny_task_files["model"]}
    task = agent_server.serve_task(42, files)
    task["files"] = {"validation": task["files"]["validation"]}
    # Alone on the device at the lease (no `max_seconds`); from the third round on, another job's task waits.
    agent_server.route("POST", PROGRESS.format(42), [Answer(200, {"cancel": False, "lease_expires_at": "x"})] * 4
                       + [Answer(200, {"cancel": False, "lease_expires_at": "x", "max_seconds": 0.001})])
    task["retime"] = {"rounds": 20, "min_rounds": 6, "max_seconds": None,
                      "window": {"warmup_runs": 1, "warmup_seconds": 0.0, "min_runs": 3, "min_seconds": 0.0},
                      "variants": [{"task": 7, "key": "fp32", "backend": "onnxruntime", "compile": {}, "model": task_files_entry(task, files, "retime-7")},
                                   {"task": 8, "key": "copy", "backend": "onnxruntime", "compile": {}, "model": task_files_entry(task, files, "retime-8")}]}
    assert runner.run(task) == "succeeded"
    [result] = agent_server.results(42)
    # Its minimum rounds still ran; then it stopped at once, 14 rounds short of the cap.
    assert result["metrics"]["stopped"] == "time" and len(result["metrics"]["retime"][0]["interleaved_medians_ms"]) == 6


def task_files_entry(task: dict, files: dict, name: str) -> dict:
    return {"url": f"/api/agent/v1/tasks/{task['id']}/files/{name}", "sha256": hashlib.sha256(files[name]).hexdigest(), "size_bytes": len(files[name])}


def test_a_measure_task_reports_the_quiet_window_it_was_timed_in(agent_server, runner, tiny_task_files, tmp_path, monkeypatch):
    from devices import quiet

    monkeypatch.setenv(quiet.QUIET_DIR_ENV, str(tmp_path / "quiet"))
    monkeypatch.setenv(quiet.BUSY_CORES_ENV, "1000")
    task = agent_server.serve_task(41, tiny_task_files)
    assert runner.run(task) == "succeeded"
    [result] = agent_server.results(41)
    [window] = result["metrics"]["windows"]
    assert window["retaken"] == 0 and window["busy"] is False and window["builds_paused"] is True
    assert window["before"]["loadavg"] and window["after"]["loadavg"] and window["seconds"] > 0


@pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed")
def test_a_runtime_that_disagrees_with_onnx_runtime_on_the_same_file_fails_as_a_runtime_fault(
        agent_server, runner, tiny_task_files, monkeypatch):
    from devices.backends.openvino import OpenVinoCompiledModel

    real_run = OpenVinoCompiledModel.run
    # OpenVINO misreading a file (issue 24's QDQ detector): outputs unrelated to what the file computes.
    monkeypatch.setattr(OpenVinoCompiledModel, "run", lambda self, feeds: {k: -v for k, v in real_run(self, feeds).items()})
    task = agent_server.serve_task(41, tiny_task_files, backend="openvino")
    assert runner.run(task) == "failed"
    [result] = agent_server.results(41)
    assert result["error"].startswith("runtime fault: openvino and onnxruntime disagree on the same file")
    assert not {"profile", "evaluate"} & set(_stages(agent_server, 41))  # it stopped before any timing or judging
    assert not agent_server.hits("POST", "/api/agent/v1/tasks/41/artifact")


def test_the_agent_judges_an_encoder_on_the_tokens_its_attention_mask_keeps(agent_server, runner, masked_encoder_case):
    files, plan, _, _ = masked_encoder_case
    task = agent_server.serve_task(51, files)
    task["evaluation"] = plan
    assert runner.run(task) == "succeeded"
    [result] = agent_server.results(51)
    hidden = result["accuracy"]["outputs"]["last_hidden_state"]
    assert hidden["errors"] == {} and hidden["metrics"]["kept_tokens"] == 12
    assert hidden["metrics"]["cosine_p5"] == pytest.approx(1.0) and hidden["metrics"]["sentence_cosine_p5"] == pytest.approx(1.0)
    assert hidden["metrics"]["max_abs_error"] < 1e-5  # the padded positions, 5.0 in the reference, are left out


@pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed")
def test_an_ir_onnx_runtime_cannot_read_is_checked_against_its_fp32_source_before_it_is_timed(agent_server, runner, tiny_task_files, tiny_ir_path):
    files = {**tiny_task_files, "model": tiny_ir_path.read_bytes()}
    task = agent_server.serve_task(44, files, backend="openvino")
    assert runner.run(task) == "succeeded"
    [result] = agent_server.results(44)
    check = result["metrics"]["runtime_check"]
    assert check["against"] == "fp32 source on onnxruntime" and check["samples"] == 4
    assert check["fault"] is False and check["min_cosine"] > 0.999


@pytest.mark.skipif(not HAS_OPENVINO, reason="openvino is not installed")
def test_an_ir_far_from_its_fp32_source_fails_as_a_runtime_fault_with_the_check_recorded(
        agent_server, runner, tiny_task_files, tiny_ir_path, monkeypatch):
    from devices.backends.openvino import OpenVinoCompiledModel

    real_run = OpenVinoCompiledModel.run
    monkeypatch.setattr(OpenVinoCompiledModel, "run", lambda self, feeds: {k: -v for k, v in real_run(self, feeds).items()})
    task = agent_server.serve_task(45, {**tiny_task_files, "model": tiny_ir_path.read_bytes()}, backend="openvino")
    task["variant"]["precision"] = "int8"
    assert runner.run(task) == "failed"
    [result] = agent_server.results(45)
    assert result["error"].startswith("runtime fault: openvino INT8 IR disagrees with its FP32 source on ONNX Runtime: cosine -1.000")
    assert result["metrics"]["runtime_check"]["fault"] is True and result["metrics"]["runtime_check"]["min_cosine"] < 0
    assert result["accuracy"] is None  # the disagreement is not counted as the variant's accuracy
    assert not {"profile", "evaluate"} & set(_stages(agent_server, 45))  # stopped before any timing or judging
    assert not agent_server.hits("POST", "/api/agent/v1/tasks/45/artifact")


def test_side_by_side_rounds_stop_for_time_only_past_their_minimum_and_only_when_the_server_set_a_time():
    from devices.agent.runner import _seconds
    from kiln_contract.paired import out_of_time

    assert out_of_time(60.0, 30.0, rounds=6, min_rounds=6) == "time"
    assert out_of_time(60.0, 30.0, rounds=5, min_rounds=6) is None  # the minimum rounds always run
    assert out_of_time(0.5, 30.0, rounds=9, min_rounds=6) is None
    assert out_of_time(60.0, None, rounds=29, min_rounds=6) is None  # nobody else waits: the round cap alone
    assert [_seconds(value) for value in (30, "12.5", None, "x", 0, -3)] == [30.0, 12.5, None, None, None, None]
