"""One device task, end to end: download, compile, benchmark, profile, evaluate, upload, report.

Stages run in that order so that the expensive, interruptible work comes first: when the agent
is asked to stop, a task still downloading, compiling, benchmarking or profiling is handed back
(reported as `handed_back`, so the server queues it again at once for another agent), while a
task already evaluating or uploading is finished, which takes seconds.
"""

from __future__ import annotations

import collections
import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from devices import bench, crosscheck, quiet, support
from devices.agent import arm
from devices.agent.client import AgentClient, AgentUnauthorized, ApiError, ServerUnavailable, StaleAttempt
from devices.backends.base import CompiledModel, TensorSpec
from devices.backends.options import InvalidCompileOptions, parse_compile_options
from devices.backends.registry import get_backend
from kiln_contract import feeds, metrics, operator_support, paired
from kiln_contract.batching import sample_rows

logger = logging.getLogger(__name__)

DOWNLOAD_ATTEMPTS = 3
PROFILE_RUNS = 10
LOG_LIMIT_BYTES = 64 * 1024
STOPPING_REASON = "agent stopping"
FILE_NAMES = {"model": "model.onnx", "validation": "validation.npz", "reference": "reference.npz"}
# Stages a stopping agent finishes instead of handing the task back.
FINISH_ON_STOP = frozenset({"evaluate", "upload", "result"})
PERCENT = {"download": 0, "support": 5, "compile": 10, "benchmark": 25, "profile": 60, "evaluate": 70,
           "upload": 85, "result": 95}
# While it waits for a quiet window the agent reports progress this often, which keeps its lease.
KEEPALIVE_S = 2.0


class TaskCanceled(Exception):
    """The server canceled the task (progress answer or heartbeat): stop, post nothing."""


class AgentStopping(Exception):
    """The agent is shutting down during a stage that hands the task back."""


class TaskFailed(Exception):
    """The task cannot succeed; the message is the reason reported to the server, `metrics` what was measured on the way."""

    def __init__(self, message: str, metrics: dict | None = None):
        super().__init__(message)
        self.metrics = metrics or {}


class TaskLogCapture(logging.Handler):
    """Keeps the last LOG_LIMIT_BYTES of log lines emitted by one thread."""

    def __init__(self, thread_id: int, limit_bytes: int = LOG_LIMIT_BYTES):
        super().__init__(logging.DEBUG)
        self.thread_id = thread_id
        self.limit_bytes = limit_bytes
        self.lines: collections.deque[str] = collections.deque()
        self.size = 0
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread != self.thread_id:
            return
        try:
            line = self.format(record)
        except Exception:
            return
        self.lines.append(line)
        self.size += len(line.encode("utf-8", "replace")) + 1
        while self.size > self.limit_bytes and len(self.lines) > 1:
            self.size -= len(self.lines.popleft().encode("utf-8", "replace")) + 1

    def text(self) -> str:
        data = "\n".join(self.lines).encode("utf-8", "replace")
        return data[-self.limit_bytes :].decode("utf-8", "ignore")


def load_npz(path: Path) -> dict[str, np.ndarray]:
    """All arrays of an .npz; never unpickles (a task file must not run code)."""
    with np.load(path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def sample_count(inputs: dict[str, np.ndarray]) -> int:
    counts = {name: array.shape[0] if array.ndim else 1 for name, array in inputs.items()}
    if len(set(counts.values())) > 1:
        raise TaskFailed(f"validation inputs disagree on the number of samples: {counts}")
    return next(iter(counts.values()))


def _take_rows(array: np.ndarray, start: int, rows: int) -> np.ndarray:
    """`rows` rows from `start`, padded by repeating the last available row."""
    chunk = array[start : start + rows]
    if chunk.shape[0] < rows:
        padding = np.repeat(chunk[-1:], rows - chunk.shape[0], axis=0)
        chunk = np.concatenate([chunk, padding], axis=0)
    return chunk


def _feed_batch(spec: TensorSpec) -> int:
    batch = spec.static_batch
    return batch if batch and batch > 0 else 1


def make_feeds(
    specs: list[TensorSpec], batch_size: int, samples: dict[str, np.ndarray] | None = None,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Inputs of `batch_size` for the model: rows of the validation data when it has the input,
    otherwise seeded random data (dynamic non-batch dimensions become 1)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in specs:
        if samples is not None and spec.name in samples and samples[spec.name].ndim:
            array = _take_rows(samples[spec.name], 0, batch_size)
        else:
            shape = [batch_size if index == 0 and dim is None else (dim or 1)
                     for index, dim in enumerate(spec.shape)]
            if np.issubdtype(spec.dtype, np.floating):
                array = rng.standard_normal(shape)
            else:
                array = np.zeros(shape)
        feeds[spec.name] = np.ascontiguousarray(array, dtype=spec.dtype)
    return feeds


def benchmark_batch_sizes(specs: list[TensorSpec], requested: list[int]) -> list[int]:
    """The requested batch sizes, or only the model's static batch when it has one."""
    static = {spec.static_batch for spec in specs if spec.shape and spec.static_batch}
    if static:
        batch = max(static)
        if requested != [batch]:
            logger.info("model has static batch %d; benchmarking only that (asked %s)", batch, requested)
        return [batch]
    return list(dict.fromkeys(requested)) or [1]


def evaluate_outputs(
    compiled: CompiledModel,
    inputs: dict[str, np.ndarray],
    check: Callable[[], None] | None = None,
) -> dict[str, np.ndarray]:
    """Run every validation sample (batch 1, or the model's static batch) and stack outputs."""
    missing = [name for name in compiled.input_names if name not in inputs]
    if missing:
        raise TaskFailed(f"validation data lacks model inputs: {', '.join(missing)}")
    specs = {spec.name: spec for spec in compiled.input_specs}
    model_inputs = {name: inputs[name] for name in compiled.input_names}
    total = sample_count(model_inputs)
    batch = max(_feed_batch(spec) for spec in compiled.input_specs) if compiled.input_specs else 1
    collected: dict[str, list[np.ndarray]] = {name: [] for name in compiled.output_names}
    for start in range(0, total, batch):
        if check is not None:
            check()
        rows = min(batch, total - start)
        feeds = {
            name: np.ascontiguousarray(_take_rows(array, start, batch), dtype=specs[name].dtype)
            for name, array in model_inputs.items()
        }
        outputs = compiled.run(feeds)
        for name in compiled.output_names:
            try:
                collected[name].append(sample_rows(outputs[name], batch_size=batch, rows=rows))
            except ValueError as exc:
                raise TaskFailed(f"output {name!r}: {exc}") from None
    return {name: np.concatenate(parts, axis=0) for name, parts in collected.items() if parts}


def _dtypes(compiled: CompiledModel) -> dict[str, np.dtype]:
    return {spec.name: spec.dtype for spec in compiled.input_specs}


def first_call_feeds(compiled: CompiledModel, validation_path: Path, plan: dict) -> dict[str, np.ndarray]:
    """The feeds of the first call of the first sample, state inputs at their initial values."""
    stateless = {**plan, "state": {}}  # the first call needs no model run: its state is the initial value
    for _, _, fed, _ in feeds.iter_calls(None, validation_path, stateless, input_names=compiled.input_names, limit=1):
        fed = {**fed, **feeds.initial_state(plan)}
        return {name: feeds.contiguous(value, _dtypes(compiled).get(name, value.dtype)) for name, value in fed.items()}
    raise TaskFailed("the validation data has no samples")


def evaluate_calls(compiled: CompiledModel, validation_path: Path, plan: dict, reference: dict[str, np.ndarray],
                   evaluation: dict | None, check: Callable[[], None] | None = None) -> dict:
    """Run the validation set sample by sample (sequences call by call, carrying state) and compare with FP32.

    Sequences also get per-step figures, so a drift that builds up over the steps shows. The inputs
    the plan's metrics read (attention masks) are stacked call by call beside the outputs.
    """
    stack = feeds.OutputStack(compiled.output_names)
    read = feeds.OutputStack([name for name in metric_inputs(evaluation) if name in compiled.input_names])
    try:
        for sample, step, fed, outputs in feeds.iter_calls(compiled.run, validation_path, plan, input_names=compiled.input_names,
                                                           dtypes=_dtypes(compiled), check=check):
            stack.add(sample, step, outputs)
            read.add(sample, step, fed)
        outputs = stack.arrays()
        labels_array = _call_labels(validation_path, plan) if evaluation and evaluation.get("labels") else None
        accuracy = metrics.evaluate(outputs, reference, evaluation, labels_array, inputs=read.arrays())
    except feeds.FeedError as exc:
        raise TaskFailed(str(exc)) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise TaskFailed(f"outputs do not match the reference: {exc}") from None
    accuracy["calls"] = len(stack.steps)
    if plan.get("mode") == feeds.SEQUENCES:
        accuracy["sequences"] = len(set(stack.samples))
        accuracy["per_step"] = feeds.per_step_figures(outputs, reference, stack.steps)
    return accuracy


def metric_inputs(evaluation: dict | None) -> list[str]:
    """The inputs whose values the plan's metrics read: attention masks of per-token outputs."""
    outputs = (evaluation or {}).get("outputs") or []
    return list(dict.fromkeys(entry["options"]["mask"] for entry in outputs if (entry.get("options") or {}).get("mask")))


def self_check(task: dict, compiled: CompiledModel, paths: dict, fed: dict[str, np.ndarray], *, plan: dict | None,
               validation: dict[str, np.ndarray] | None, reference: dict[str, np.ndarray] | None) -> dict | None:
    """The runtime self-check (devices/crosscheck.py) against the reference the artifact has; None when none is run.

    Raises TaskFailed, carrying the check as `metrics.runtime_check`, on a runtime fault.
    """
    backend_name = task.get("backend") or "onnxruntime"
    against = crosscheck.reference_for(backend_name, paths["model"])
    try:
        if against == crosscheck.REFERENCE_BACKEND:
            return crosscheck.cross_check(compiled, paths["model"], fed, backend_name=backend_name)
        if against != crosscheck.FLOAT_SOURCE:
            return None
        if reference is None or (validation is None and not feeds.needs_calls(plan)):
            logger.info("runtime self-check skipped: no FP32 reference outputs for the validation samples")
            return None
        try:
            outputs, samples = first_samples_outputs(compiled, validation, paths["validation"], plan, crosscheck.SOURCE_SAMPLES)
        except (feeds.FeedError, TaskFailed) as exc:  # the evaluation reports what does not fit, with its figures
            logger.info("runtime self-check skipped: %s", exc)
            return None
        return crosscheck.source_check(outputs, reference, paths["model"], backend_name=backend_name, samples=samples,
                                       precision=(task.get("variant") or {}).get("precision") or "")
    except crosscheck.RuntimeFault as fault:
        raise TaskFailed(str(fault), metrics={"runtime_check": fault.check}) from None


def first_samples_outputs(compiled: CompiledModel, validation: dict[str, np.ndarray] | None, validation_path: Path,
                          plan: dict | None, samples: int) -> tuple[dict[str, np.ndarray], int]:
    """The compiled model's outputs for the first `samples` validation samples, stacked as the reference stacks them
    (sample by sample, or call by call for a plan that needs calls), and how many samples that was."""
    if feeds.needs_calls(plan):
        stack = feeds.OutputStack(compiled.output_names)
        for sample, step, _, outputs in feeds.iter_calls(compiled.run, validation_path, plan, input_names=compiled.input_names,
                                                         dtypes=_dtypes(compiled), limit=samples):
            stack.add(sample, step, outputs)
        return stack.arrays(), len(set(stack.samples))
    outputs = evaluate_outputs(compiled, {name: array[:samples] for name, array in validation.items()})
    return outputs, min((len(value) for value in outputs.values()), default=0)


def _call_labels(validation_path: Path, plan: dict) -> np.ndarray | None:
    rows = [row[feeds.LABELS] for row in feeds.iter_rows(validation_path, [feeds.LABELS]) if feeds.LABELS in row]
    return np.stack(rows) if rows and plan.get("mode") != feeds.SEQUENCES else None


def _seconds(value) -> float | None:
    """A positive number of seconds from a task's plan, else None (absent, or not a number an agent can use)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if seconds > 0 else None


class TaskRunner:
    """Runs leased tasks one at a time in the calling thread."""

    def __init__(
        self,
        client: AgentClient,
        work_dir: Path,
        *,
        stop_event: threading.Event | None = None,
        threads: int | None = None,
        keep_work_dirs: bool = False,
    ):
        self.client = client
        self.work_dir = Path(work_dir)
        self.stop_event = stop_event or threading.Event()
        self.threads = threads
        # This device's name, for the host's builds to say whose timing they wait for (devices/quiet.py).
        self.agent_name = ""
        self.keep_work_dirs = keep_work_dirs
        self.stage: str | None = None
        # This task's runtime's operator-support answer, sent with its result whatever the outcome.
        self.support: dict | None = None

    # -- control -------------------------------------------------------------------------------

    def _check(self, task_id: int, cancel: threading.Event, stage: str | None = None) -> None:
        """Raise if the task was canceled, or if the agent is stopping in a hand-back stage."""
        if cancel.is_set():
            raise TaskCanceled(f"task {task_id} canceled by the server")
        if self.stop_event.is_set() and (stage or self.stage) not in FINISH_ON_STOP:
            raise AgentStopping(STOPPING_REASON)

    def _enter(self, task: dict, cancel: threading.Event, stage: str, message: str) -> dict:
        self._check(task["id"], cancel, stage)
        self.stage = stage
        logger.info("task %s: %s: %s", task["id"], stage, message)
        try:
            answer = self.client.progress(
                task["id"], attempt=task["attempt"], stage=stage, message=message,
                percent=PERCENT.get(stage),
            )
        except (AgentUnauthorized, StaleAttempt):
            raise
        except (ApiError, ServerUnavailable) as exc:
            # The lease may lapse; the result post will then tell us with a 409.
            logger.warning("task %s: progress report failed: %s", task["id"], exc)
            return {}
        if answer.get("cancel"):
            cancel.set()
            raise TaskCanceled(f"task {task['id']} canceled by the server")
        return answer

    # -- the pipeline --------------------------------------------------------------------------

    def run(self, task: dict, cancel: threading.Event | None = None) -> str:
        """Run one leased task; return "succeeded", "failed", "canceled", "stale" or
        "handed_back". Raises AgentUnauthorized (the agent must stop)."""
        cancel = cancel or threading.Event()
        task_dir = self.work_dir / f"task-{task['id']}-attempt-{task['attempt']}"
        capture = TaskLogCapture(threading.get_ident())
        package_logger = logging.getLogger("devices")
        package_logger.addHandler(capture)
        previous_level = package_logger.level
        if package_logger.getEffectiveLevel() > logging.INFO:
            package_logger.setLevel(logging.INFO)
        self.stage = None
        self.support = None
        try:
            try:
                payload = self._pipeline(task, cancel, task_dir)
            except TaskCanceled as exc:
                logger.info("%s; dropping it without a result", exc)
                return "canceled"
            except StaleAttempt as exc:
                logger.warning("task %s: attempt %s is stale (%s); dropping it",
                               task["id"], task["attempt"], exc.message)
                return "stale"
            except AgentUnauthorized:
                raise
            except AgentStopping:
                logger.info("task %s: handing back: %s", task["id"], STOPPING_REASON)
                return self._post(task, self._hand_back(task, capture.text()), "handed_back")
            except Exception as exc:
                reason = str(exc) if isinstance(exc, TaskFailed) else f"{type(exc).__name__}: {exc}"
                logger.error("task %s failed in %s: %s", task["id"], self.stage, reason,
                             exc_info=not isinstance(exc, TaskFailed))
                measured = exc.metrics if isinstance(exc, TaskFailed) else {}
                return self._post(task, self._failure(task, reason, capture, measured), "failed")
            payload["log"] = capture.text()
            return self._post(task, payload, "succeeded")
        finally:
            package_logger.removeHandler(capture)
            package_logger.setLevel(previous_level)
            self.stage = None
            if not self.keep_work_dirs:
                shutil.rmtree(task_dir, ignore_errors=True)

    @staticmethod
    def _hand_back(task: dict, log: str = "") -> dict:
        """A result that returns the task to the queue at once, for another agent or a later lease."""
        return {"attempt": task["attempt"], "status": "handed_back", "error": STOPPING_REASON, "metrics": {},
                "accuracy": None, "profile": None, "log": log}

    def _failure(self, task: dict, reason: str, capture: TaskLogCapture, metrics: dict | None = None) -> dict:
        return {"attempt": task["attempt"], "status": "failed", "error": reason, "metrics": metrics or {},
                "accuracy": None, "profile": None, "log": capture.text(), "support": self.support}

    def _post(self, task: dict, payload: dict, outcome: str) -> str:
        self.stage = "result"
        try:
            self.client.result(task["id"], payload)
        except StaleAttempt as exc:
            logger.warning("task %s: result refused, attempt is stale: %s", task["id"], exc.message)
            return "stale"
        except (ApiError, ServerUnavailable) as exc:
            logger.error("task %s: could not post the result: %s", task["id"], exc)
            return "failed"
        logger.info("task %s: %s", task["id"], outcome)
        return outcome

    def _pipeline(self, task: dict, cancel: threading.Event, task_dir: Path) -> dict:
        task_id = task["id"]
        task_dir.mkdir(parents=True, exist_ok=True)
        files = task.get("files") or {}
        if task.get("retime"):
            return self._retime(task, cancel, task_dir)
        if not files.get("model"):
            raise TaskFailed("the task has no model file")

        self._enter(task, cancel, "download", "downloading task files")
        paths = {}
        for key in ("model", "validation", "reference"):
            if files.get(key):
                self._check(task_id, cancel)
                paths[key] = self.download_verified(key, files[key], task_dir / FILE_NAMES[key])

        backend_name = task.get("backend") or "onnxruntime"
        backend = get_backend(backend_name)
        self._enter(task, cancel, "support", f"asking {backend_name} {backend.version() or ''} which operators it runs")
        self.support = support.ask(backend, paths["model"])
        logger.info("operator support: %s", operator_support.summary(self.support))
        if not operator_support.runnable(self.support):
            # The runtime said no before anything was built: that reason is the task's, not a compile crash.
            raise TaskFailed(self.support.get("reason") or operator_support.summary(self.support))
        self._enter(task, cancel, "compile", f"compiling with {backend_name}")
        bench.reset_peak_rss()
        started = time.perf_counter_ns()
        try:
            compile_options = parse_compile_options(task.get("compile"))
        except InvalidCompileOptions as exc:
            raise TaskFailed(f"the task's compile options are invalid: {exc}") from None
        compiled = backend.compile(paths["model"], task_dir / "compiled", threads=self.threads, options=compile_options)
        load_ms = (time.perf_counter_ns() - started) / bench.NS_PER_MS
        logger.info("compiled in %.1f ms: %s (%d bytes), %d threads", load_ms,
                    compiled.artifact_path.name, compiled.artifact_path.stat().st_size, compiled.threads)
        try:
            return self._measure(task, cancel, compiled, paths, load_ms)
        finally:
            compiled.close()

    def _measure(self, task, cancel, compiled: CompiledModel, paths: dict, load_ms: float) -> dict:
        task_id = task["id"]
        plan = (task.get("evaluation") or {}).get("feeds")
        by_calls = feeds.needs_calls(plan) and "validation" in paths
        validation = load_npz(paths["validation"]) if "validation" in paths and not by_calls else None
        reference = load_npz(paths["reference"]) if "reference" in paths else None
        labels = validation.pop("labels", None) if validation is not None else None

        self._enter(task, cancel, "benchmark", "measuring latency")
        settings = bench.BenchmarkSettings.from_dict(task.get("benchmark"))
        if by_calls:
            # Each call is fed exactly its sample's tensors: the batch is what the data says.
            batch_sizes = [1]
            feeds_by_batch = {1: first_call_feeds(compiled, paths["validation"], plan)}
        else:
            batch_sizes = benchmark_batch_sizes(compiled.input_specs, settings.batch_sizes)
            feeds_by_batch = {size: make_feeds(compiled.input_specs, size, validation) for size in batch_sizes}
        # Before anything is timed or judged: a runtime that misreads the file fails the task as the runtime's fault.
        runtime_check = self_check(task, compiled, paths, feeds_by_batch[batch_sizes[0]], plan=plan, validation=validation,
                                   reference=reference)
        stop_or_cancel = lambda: cancel.is_set() or self.stop_event.is_set()  # noqa: E731
        try:
            speed, window = quiet.measure_quietly(
                lambda: bench.run_benchmark(compiled, feeds_by_batch, settings, load_ms=load_ms, should_stop=stop_or_cancel),
                threads=compiled.threads, should_stop=self._waiting(task, cancel), label=self._timing_label(task))
        except (bench.BenchmarkInterrupted, quiet.WindowInterrupted):
            self._check(task_id, cancel)
            raise
        speed["windows"] = [window.as_dict()]
        speed["size_bytes"] = compiled.artifact_path.stat().st_size
        if compiled.float_precision:
            speed["float_precision"] = compiled.float_precision
        if runtime_check:
            speed["runtime_check"] = runtime_check
        emulated = arm.emulation()
        if emulated:
            logger.warning("timings taken under emulation are not this device's speed: %s", emulated)
            speed["emulated"] = emulated

        self._enter(task, cancel, "profile", "profiling per operator")
        profile_feeds = feeds_by_batch[batch_sizes[0]]
        try:
            profile = compiled.profile(profile_feeds, runs=PROFILE_RUNS)
        except NotImplementedError as exc:
            profile = {"by_op_type": [], "by_node": [], "error": str(exc)}
        except Exception as exc:
            logger.warning("profiling failed: %s: %s", type(exc).__name__, exc)
            profile = {"by_op_type": [], "by_node": [], "error": f"{type(exc).__name__}: {exc}"}

        accuracy = None
        if by_calls and reference is not None:
            self._enter(task, cancel, "evaluate", "comparing outputs with the FP32 reference, call by call")
            accuracy = evaluate_calls(compiled, paths["validation"], plan, reference, task.get("evaluation"),
                                      check=lambda: self._check(task_id, cancel, "evaluate"))
        elif validation is not None and reference is not None:
            self._enter(task, cancel, "evaluate", "comparing outputs with the FP32 reference")
            outputs = evaluate_outputs(
                compiled, validation, check=lambda: self._check(task_id, cancel, "evaluate")
            )
            try:
                accuracy = metrics.evaluate(outputs, reference, task.get("evaluation"), labels, inputs=validation)
            except (ValueError, KeyError, TypeError) as exc:
                raise TaskFailed(f"outputs do not match the reference: {exc}") from None
            for name, result in accuracy["outputs"].items():
                figure = result["primary_metric"]
                logger.info("accuracy of %s (%s): %s %s%s", name, result["kind"], figure, result["metrics"].get(figure),
                            f"; errors: {result['errors']}" if result["errors"] else "")
        else:
            logger.info("no validation or reference data: skipping evaluation")

        self._enter(task, cancel, "upload", "uploading the compiled artifact")
        answer = self.client.upload_artifact(task_id, attempt=task["attempt"], path=compiled.artifact_path)
        logger.info("artifact uploaded, sha256 %s", answer.get("sha256"))
        return {"attempt": task["attempt"], "status": "succeeded", "error": None,
                "metrics": speed, "accuracy": accuracy, "profile": profile, "support": self.support}

    def _waiting(self, task: dict, cancel: threading.Event) -> Callable[[], bool]:
        """`should_stop` for the wait for a quiet window: stop or cancel, and a progress report every KEEPALIVE_S (the lease)."""
        last = [time.monotonic()]

        def check() -> bool:
            if cancel.is_set() or self.stop_event.is_set():
                return True
            if time.monotonic() - last[0] >= KEEPALIVE_S:
                last[0] = time.monotonic()
                self._enter(task, cancel, self.stage or "benchmark", "waiting for a quiet window (builds on this host pausing)")
            return False

        return check

    def _retime(self, task: dict, cancel: threading.Event, task_dir: Path) -> dict:
        """A RETIME task: compile the finalists again and time them side by side in rotated, interleaved rounds.

        Rounds continue until the leader separates at 95% or every rival is a settled tie (at least
        `min_rounds`), or `rounds` (the cap) is reached (kiln_contract/paired.py); each round is a quiet window,
        re-taken when busy. Sends `metrics.retime`: per variant (its measure task), its median in each
        round and the summary of all its rounds' samples (`bench.side_by_side_row`: one measurement set for
        the whole row); `metrics.stopped`: why the rounds stopped; `metrics.windows`: each round's window.
        When the server asks (`wait_for_quiet_s`: the last rounds were busy), the rounds wait first for the
        device to be quiet, up to that long, and `metrics.quiet_wait` says how that went.
        """
        plan = task["retime"]
        variants = plan.get("variants") or []
        if len(variants) < 2:
            raise TaskFailed("a re-timing task needs at least two variants")
        files = task.get("files") or {}
        self._enter(task, cancel, "download", f"downloading {len(variants)} variants to re-time side by side")
        validation = None
        if files.get("validation"):
            validation = load_npz(self.download_verified("validation", files["validation"], task_dir / FILE_NAMES["validation"]))
            validation.pop("labels", None)
        paths = []
        for row in variants:
            self._check(task["id"], cancel)
            paths.append(self.download_verified(f"variant {row['task']}", row["model"], task_dir / f"retime-{int(row['task'])}.onnx"))
        self._enter(task, cancel, "compile", f"compiling {len(variants)} variants")
        compiled: list[CompiledModel] = []
        try:
            for row, path in zip(variants, paths):
                try:
                    options = parse_compile_options(row.get("compile"))
                except InvalidCompileOptions as exc:
                    raise TaskFailed(f"variant {row['task']}: invalid compile options: {exc}") from None
                compiled.append(get_backend(row["backend"]).compile(path, task_dir / f"compiled-{int(row['task'])}",
                                                                    threads=self.threads, options=options))
            max_rounds = max(1, int(plan.get("rounds") or paired.MIN_ROUNDS))
            min_rounds = min(max_rounds, int(plan.get("min_rounds") or max_rounds))
            threads = max(model.threads for model in compiled)
            batch_sizes = [benchmark_batch_sizes(model.input_specs, [1])[0] for model in compiled]
            runs = [model.bind(make_feeds(model.input_specs, size, validation)) for model, size in zip(compiled, batch_sizes)]
            try:
                quiet_wait = self._wait_for_quiet(task, cancel, float(plan.get("wait_for_quiet_s") or 0.0), threads)
                self._enter(task, cancel, "benchmark", f"up to {max_rounds} interleaved rounds of {len(variants)} variants")
                samples, windows, stopped = self._interleaved_rounds(task, cancel, runs, bench.BenchmarkSettings.from_dict(plan.get("window")),
                                                                     min_rounds=min_rounds, max_rounds=max_rounds, threads=threads,
                                                                     max_seconds=_seconds(plan.get("max_seconds")))
            except (bench.BenchmarkInterrupted, quiet.WindowInterrupted):
                self._check(task["id"], cancel)
                raise
        finally:
            for model in compiled:
                model.close()
        medians = [[float(np.median(part)) for part in parts] for parts in samples]
        logger.info("re-timed %s in %d rounds (%s): %s", [row["key"] for row in variants], len(medians[0]), stopped,
                    [round(float(np.median(m)), 4) for m in medians])
        rows = [{"task": int(row["task"]), "interleaved_medians_ms": values, **bench.side_by_side_row(parts, batch_size=size)}
                for row, values, parts, size in zip(variants, medians, samples, batch_sizes)]
        metrics = {"retime": rows, "stopped": stopped, "windows": windows}
        if quiet_wait is not None:
            metrics["quiet_wait"] = quiet_wait
        return {"attempt": task["attempt"], "status": "succeeded", "error": None, "accuracy": None, "profile": None, "metrics": metrics}

    def _wait_for_quiet(self, task: dict, cancel: threading.Event, timeout_s: float, threads: int) -> dict | None:
        """Before rounds the server re-times because the last ones were busy: wait (up to `timeout_s`) for a quiet device."""
        if timeout_s <= 0:
            return None
        self._enter(task, cancel, "benchmark", f"waiting up to {timeout_s:.0f} s for the device to be quiet (the last rounds were busy)")
        was_quiet, waited = quiet.wait_until_quiet(threads=threads, timeout_s=timeout_s, should_stop=self._waiting(task, cancel))
        return {"quiet": was_quiet, "waited_s": round(waited, 3)}

    def _timing_label(self, task: dict) -> str:
        """What this window times, for builds paused on this host: "local times job 2"."""
        who = self.agent_name or "a device of this host"
        return f"{who} times job {task.get('job')}" if task.get("job") else f"{who} times a task"

    def _interleaved_rounds(self, task: dict, cancel: threading.Event, runs: list, settings: bench.BenchmarkSettings, *,
                            min_rounds: int, max_rounds: int, threads: int,
                            max_seconds: float | None = None) -> tuple[list[list[np.ndarray]], list[dict], str]:
        """Rotated rounds, each in its own quiet window, until `paired.stop_reason` says stop, or, once `min_rounds` are
        done, `max_seconds` have passed (other jobs wait for the device: "time"); (each run's samples per round, windows, why)."""
        started = time.monotonic()
        stop_or_cancel = lambda: cancel.is_set() or self.stop_event.is_set()  # noqa: E731
        samples: list[list[np.ndarray]] = [[] for _ in runs]
        medians: list[list[float]] = [[] for _ in runs]
        windows: list[dict] = []
        while True:
            done = len(medians[0])
            parts, window = quiet.measure_quietly(
                lambda shift=done: bench.interleaved_round_samples(runs, settings, shift=shift, should_stop=stop_or_cancel),
                threads=threads, should_stop=self._waiting(task, cancel), label=self._timing_label(task))
            for index, part in enumerate(parts):
                samples[index].append(part)
                medians[index].append(float(np.median(part)))
            windows.append(window.as_dict())
            stopped = paired.stop_reason(medians, min_rounds=min_rounds, max_rounds=max_rounds) or paired.out_of_time(
                time.monotonic() - started, max_seconds, rounds=done + 1, min_rounds=min_rounds)
            # The rounds together outlast a lease: each round's progress report extends it, and its answer says how long the
            # rounds may still hold the device (another job's task may have come to wait since the lease).
            answer = self._enter(task, cancel, "benchmark", f"interleaved round {done + 1} (at most {max_rounds})"
                                 + (f": {stopped}" if stopped else ""))
            if stopped:
                return samples, windows, stopped
            if "max_seconds" in answer:
                max_seconds = _seconds(answer["max_seconds"])

    def download_verified(self, key: str, spec: dict, destination: Path) -> Path:
        """Download a task file and check its sha256, trying DOWNLOAD_ATTEMPTS times in all."""
        expected = (spec.get("sha256") or "").lower()
        actual = None
        for attempt in range(1, DOWNLOAD_ATTEMPTS + 1):
            actual = self.client.download(spec["url"], destination)
            if not expected or actual == expected:
                if not expected:
                    logger.warning("%s has no sha256 in the task; not verified", key)
                return destination
            logger.warning("sha256 mismatch for %s (try %d of %d): expected %s got %s",
                           key, attempt, DOWNLOAD_ATTEMPTS, expected, actual)
        destination.unlink(missing_ok=True)
        raise TaskFailed(f"sha256 mismatch for {key}: expected {expected} got {actual}")
