"""Fixtures for the device agent: a tiny ONNX model built with onnx.helper, and a fake agent
protocol server on 127.0.0.1 (http.server in a thread) whose answers each test scripts."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

CLASSES = 10


def build_tiny_cnn(batch: int | str = "batch", seed: int = 0) -> onnx.ModelProto:
    """Conv → Relu → Reshape → MatMul → Add: [batch, 1, 8, 8] → logits [batch, 10]."""
    rng = np.random.default_rng(seed)
    initializers = [
        numpy_helper.from_array(rng.standard_normal((4, 1, 3, 3)).astype(np.float32), "conv_w"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32) * 0.1, "conv_b"),
        numpy_helper.from_array(np.array([0, -1], dtype=np.int64), "flat_shape"),
        numpy_helper.from_array(rng.standard_normal((4 * 8 * 8, CLASSES)).astype(np.float32) * 0.1, "fc_w"),
        numpy_helper.from_array(rng.standard_normal(CLASSES).astype(np.float32) * 0.1, "fc_b"),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "conv_w", "conv_b"], ["conv"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["conv"], ["relu"], name="relu"),
        helper.make_node("Reshape", ["relu", "flat_shape"], ["flat"], name="flatten"),
        helper.make_node("MatMul", ["flat", "fc_w"], ["matmul"], name="fc"),
        helper.make_node("Add", ["matmul", "fc_b"], ["logits"], name="fc_bias"),
    ]
    graph = helper.make_graph(
        nodes, "tiny_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, CLASSES])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def reference_logits(model_path: Path, inputs: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"input": inputs[i : i + 1]})[0] for i in range(len(inputs))])


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("models") / "tiny_cnn.onnx"
    onnx.save(build_tiny_cnn(), str(path))
    return path


@pytest.fixture(scope="session")
def static_batch_model_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("models") / "tiny_cnn_b4.onnx"
    onnx.save(build_tiny_cnn(batch=4), str(path))
    return path


@pytest.fixture(scope="session")
def tiny_ir_path(tiny_model_path, tmp_path_factory) -> Path:
    """The tiny CNN as a packed OpenVINO IR (FP32), a file ONNX Runtime cannot read."""
    import openvino as ov

    from devices.artifacts import pack_openvino_ir

    root = tmp_path_factory.mktemp("ir")
    ov.save_model(ov.Core().read_model(str(tiny_model_path)), str(root / "model.xml"), compress_to_fp16=False)
    return pack_openvino_ir(root / "model.xml", root / "model.bin", root / "tiny.openvino.tar")


@pytest.fixture(scope="session")
def tiny_task_files(tmp_path_factory, tiny_model_path) -> dict[str, bytes]:
    """Bytes of the three task files: model, validation npz (with labels), reference npz."""
    rng = np.random.default_rng(1)
    inputs = rng.standard_normal((6, 1, 8, 8)).astype(np.float32)
    logits = reference_logits(tiny_model_path, inputs)
    labels = np.argmax(logits, axis=1).astype(np.int64)
    labels[0] = (labels[0] + 1) % CLASSES  # the FP32 model gets 5 of 6 right
    validation, reference = io.BytesIO(), io.BytesIO()
    np.savez(validation, input=inputs, labels=labels)
    np.savez(reference, logits=logits)
    return {"model": tiny_model_path.read_bytes(), "validation": validation.getvalue(),
            "reference": reference.getvalue()}


@pytest.fixture
def sample_feeds() -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(2).standard_normal((1, 1, 8, 8)).astype(np.float32)}


# -- fake server ---------------------------------------------------------------------------------


@dataclass
class Request:
    method: str
    path: str
    headers: dict
    body: bytes

    def json(self):
        return json.loads(self.body or b"null")


@dataclass
class Answer:
    status: int = 200
    body: object = None  # dict/list → JSON, bytes → raw, None → empty
    headers: dict = field(default_factory=dict)


Route = Callable[[Request], Answer]


UPLOADS = "/api/agent/v1/uploads"


class FakeTus:
    """The server side of resumable uploads, in memory; `drop_after` cuts the next chunk's connection."""

    def __init__(self):
        self.uploads: dict[str, dict] = {}
        self.drop_after: int | None = None
        self.patches: list[tuple[int, int]] = []

    def _answer(self, handler, status: int, headers: dict | None = None, body: dict | None = None) -> None:
        payload = json.dumps(body).encode() if body is not None else b""
        handler.send_response(status)
        for key, value in {**(headers or {}), "Content-Length": str(len(payload)), "Content-Type": "application/json"}.items():
            handler.send_header(key, value)
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(payload)

    def handle(self, handler) -> None:
        if handler.command == "POST" and handler.path == UPLOADS:
            upload_id = str(len(self.uploads) + 1)
            meta = dict(item.split(" ") for item in handler.headers.get("Upload-Metadata", "").split(",") if item)
            self.uploads[upload_id] = {"length": int(handler.headers["Upload-Length"]), "data": bytearray(),
                                       "sha256": base64.b64decode(meta.get("sha256", "")).decode()}
            self._answer(handler, 201, {"Location": f"{UPLOADS}/{upload_id}", "Upload-Offset": "0"}, {"id": upload_id})
            return
        upload_id = handler.path.rsplit("/", 1)[-1]
        upload = self.uploads[upload_id]
        if handler.command == "HEAD":
            self._answer(handler, 200, {"Upload-Offset": str(len(upload["data"]))})
        elif handler.command == "PATCH":
            offset, length = int(handler.headers["Upload-Offset"]), int(handler.headers["Content-Length"])
            self.patches.append((offset, length))
            if offset != len(upload["data"]):
                handler.rfile.read(length)
                self._answer(handler, 409, body={"error": "offset", "code": "offset_mismatch"})
                return
            if self.drop_after is not None:
                upload["data"] += handler.rfile.read(min(self.drop_after, length))
                self.drop_after = None
                handler.close_connection = True
                handler.connection.shutdown(socket.SHUT_RDWR)
                return
            upload["data"] += handler.rfile.read(length)
            self._answer(handler, 204, {"Upload-Offset": str(len(upload["data"]))})
        else:
            complete = len(upload["data"]) == upload["length"]
            digest = hashlib.sha256(upload["data"]).hexdigest() if complete else None
            self._answer(handler, 200, body={"id": upload_id, "complete": complete, "sha256": digest,
                                             "offset": len(upload["data"]), "length": upload["length"]})


class FakeAgentServer:
    """Answers each (method, path) with a scripted route; records every request."""

    def __init__(self):
        self.requests: list[Request] = []
        self.routes: dict[tuple[str, str], Route] = {}
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                if self.path.startswith(UPLOADS):
                    outer.tus.handle(self)
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                request = Request(self.command, self.path, dict(self.headers), body)
                with outer.lock:
                    outer.requests.append(request)
                    route = outer.routes.get((self.command, self.path))
                answer = route(request) if route else Answer(404, {"error": "no route", "code": "not_found"})
                payload = answer.body
                content_type = "application/octet-stream"
                if isinstance(payload, (dict, list)):
                    payload, content_type = json.dumps(payload).encode(), "application/json"
                payload = payload or b""
                self.send_response(answer.status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                for key, value in answer.headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_HEAD = do_PATCH = do_PUT = _handle

        self.tus = FakeTus()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def route(self, method: str, path: str, route: Route | Answer | list) -> None:
        """Answer `path` with a function, a fixed Answer, or a list of Answers in turn (the
        last one repeats)."""
        if isinstance(route, Answer):
            fixed = route
            route = lambda request: fixed  # noqa: E731
        elif isinstance(route, list):
            queue = list(route)
            route = lambda request: queue.pop(0) if len(queue) > 1 else queue[0]  # noqa: E731
        self.routes[(method, path)] = route

    def hits(self, method: str, path: str) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.method == method and r.path == path]

    def serve_task(self, task_id: int, files: dict[str, bytes], *, attempt: int = 1,
                   benchmark: dict | None = None, backend: str = "onnxruntime",
                   sha256_override: dict | None = None) -> dict:
        """Route the files and the per-task calls of one task; return the task object."""
        prefix = f"/api/agent/v1/tasks/{task_id}"
        task_files = {}
        for name, data in files.items():
            url = f"{prefix}/files/{name}"
            self.route("GET", url, Answer(200, data))
            digest = (sha256_override or {}).get(name) or hashlib.sha256(data).hexdigest()
            task_files[name] = {"url": url, "sha256": digest, "size_bytes": len(data)}
        self.route("POST", f"{prefix}/progress", Answer(200, {"cancel": False, "lease_expires_at": "x"}))
        self.route("POST", f"{prefix}/artifact-upload", Answer(200, {"method": "resumable"}))
        self.route("POST", f"{prefix}/artifact", Answer(201, {"sha256": "abc"}))
        self.route("POST", f"{prefix}/result", Answer(200, {"ok": True}))
        return {
            "id": task_id, "attempt": attempt, "lease_expires_at": "x", "job": 1,
            "variant": {"id": 1, "precision": "fp32", "recipe": {}}, "backend": backend,
            "files": {"model": None, "validation": None, "reference": None, **task_files},
            "benchmark": benchmark or {"warmup_runs": 2, "warmup_seconds": 0.0, "min_runs": 6,
                                       "min_seconds": 0.0, "batch_sizes": [1, 2]},
            "tolerance": {"metric": "cosine", "max_drop": 0.01},
        }

    def results(self, task_id: int) -> list[dict]:
        return [r.json() for r in self.hits("POST", f"/api/agent/v1/tasks/{task_id}/result")]


@pytest.fixture
def agent_server():
    server = FakeAgentServer()
    server.thread.start()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


@pytest.fixture
def masked_encoder_case(tmp_path):
    """A masked encoder, its inputs with padding, its plan (as a task carries it, through JSON) and an FP32
    reference whose padded positions hold other values than the device will produce."""
    from devices.agent.runner import evaluate_outputs
    from devices.backends import get_backend
    from kiln_contract import contract
    from tests.fixtures.models import build_masked_encoder, padded_mask
    from workers.inspect import infer_output_kinds

    path = tmp_path / "encoder.onnx"
    onnx.save(build_masked_encoder(), path)
    inputs = {"input": np.random.default_rng(4).standard_normal((3, 6, 8)).astype(np.float32), "attention_mask": padded_mask([6, 4, 2], 6)}
    hidden = get_backend("onnxruntime").compile(path, tmp_path / "fp32", threads=1)
    try:
        reference = evaluate_outputs(hidden, inputs)
    finally:
        hidden.close()
    plan = contract.evaluation_plan(output_kinds=infer_output_kinds(path, reference), output_order=["last_hidden_state"], declared=[],
                                    has_labels=False)
    reference["last_hidden_state"][inputs["attention_mask"] == 0] = 5.0
    files = {"model": path.read_bytes()}
    for name, arrays in (("validation", inputs), ("reference", reference)):
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        files[name] = buffer.getvalue()
    return files, json.loads(json.dumps(plan)), inputs, reference

