import hashlib
import socket

import pytest

from devices.agent.client import AgentClient, AgentUnauthorized, StaleAttempt
from kiln_contract.http import ApiError, RetryPolicy, ServerUnavailable, parse_retry_after

from .conftest import Answer, FakeAgentServer

LEASE = "/api/agent/v1/tasks/lease"


class SleepRecorder:
    def __init__(self):
        self.calls = []

    def __call__(self, seconds):
        self.calls.append(seconds)


@pytest.fixture
def sleeps():
    return SleepRecorder()


@pytest.fixture
def client(agent_server, sleeps):
    return AgentClient(agent_server.url, "kiln_agt_token", sleep=sleeps,
                       retry=RetryPolicy(max_attempts=4, base_s=0.01, cap_s=0.05))


def test_503_is_retried_then_succeeds(agent_server, client, sleeps):
    agent_server.route("POST", LEASE, [Answer(503, {"error": "busy"}), Answer(503), Answer(200, {"id": 1})])
    assert client.lease(wait_s=1) == {"id": 1}
    assert len(agent_server.hits("POST", LEASE)) == 3
    assert len(sleeps.calls) == 2
    assert all(0.0 <= wait <= 0.05 for wait in sleeps.calls)


def test_429_honours_retry_after(agent_server, client, sleeps):
    agent_server.route("POST", LEASE, [Answer(429, {"error": "slow down"}, {"Retry-After": "7"}),
                                       Answer(204)])
    assert client.lease(wait_s=1) is None
    assert sleeps.calls == [7.0]


def test_400_is_an_answer_not_retried(agent_server, client, sleeps):
    agent_server.route("POST", LEASE, Answer(400, {"error": "wait_s must be positive", "code": "invalid"}))
    with pytest.raises(ApiError) as raised:
        client.lease(wait_s=1)
    assert raised.value.status == 400
    assert raised.value.message == "wait_s must be positive"
    assert raised.value.code == "invalid"
    assert len(agent_server.hits("POST", LEASE)) == 1
    assert sleeps.calls == []


def test_401_raises_agent_unauthorized(agent_server, client):
    agent_server.route("POST", "/api/agent/v1/heartbeat", Answer(401, {"error": "token revoked"}))
    with pytest.raises(AgentUnauthorized, match="token revoked"):
        client.heartbeat(capabilities={}, running_task=None)
    assert len(agent_server.hits("POST", "/api/agent/v1/heartbeat")) == 1


def test_409_raises_stale_attempt(agent_server, client):
    agent_server.route("POST", "/api/agent/v1/tasks/3/result", Answer(409, {"error": "stale attempt"}))
    with pytest.raises(StaleAttempt):
        client.result(3, {"attempt": 1, "status": "failed"})


def test_retries_run_out_on_persistent_5xx(agent_server, client, sleeps):
    agent_server.route("POST", LEASE, Answer(500))
    with pytest.raises(ServerUnavailable, match="HTTP 500"):
        client.lease(wait_s=1)
    assert len(agent_server.hits("POST", LEASE)) == 4
    assert len(sleeps.calls) == 3


def test_connection_errors_are_retried(sleeps):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = AgentClient(f"http://127.0.0.1:{port}", "t", sleep=sleeps,
                         retry=RetryPolicy(max_attempts=3, base_s=0.01, cap_s=0.01))
    with pytest.raises(ServerUnavailable, match="ConnectionError"):
        client.heartbeat(capabilities={}, running_task=None)
    assert len(sleeps.calls) == 2


def test_backoff_is_capped_full_jitter():
    policy = RetryPolicy(base_s=1.0, cap_s=4.0)
    waits = [policy.backoff_s(10) for _ in range(200)]
    assert all(0.0 <= wait <= 4.0 for wait in waits)
    assert max(waits) > 2.0 and min(waits) < 2.0


def test_parse_retry_after():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    assert parse_retry_after("soon") is None


def test_requests_carry_the_agent_token_and_contract_bodies(agent_server, client):
    agent_server.route("POST", "/api/agent/v1/tasks/9/progress", Answer(200, {"cancel": False}))
    client.progress(9, attempt=2, stage="compile", message="compiling", percent=10)
    request = agent_server.hits("POST", "/api/agent/v1/tasks/9/progress")[0]
    assert request.headers["Authorization"] == "Bearer kiln_agt_token"
    assert request.json() == {"attempt": 2, "stage": "compile", "message": "compiling", "percent": 10}


def test_register_sends_no_agent_token(agent_server):
    agent_server.route("POST", "/api/agent/v1/register", Answer(201, {"agent_id": 1, "agent_token": "x"}))
    AgentClient(agent_server.url).register(registration_token="kiln_reg_1", name="n", labels={"a": "b"},
                                          capabilities={"os": "linux"})
    request = agent_server.hits("POST", "/api/agent/v1/register")[0]
    assert "Authorization" not in request.headers
    assert request.json() == {"registration_token": "kiln_reg_1", "name": "n", "labels": {"a": "b"},
                              "capabilities": {"os": "linux"}}


def test_artifact_goes_up_resumably_then_names_the_upload(agent_server, client, tmp_path):
    artifact = tmp_path / "model.blob"
    artifact.write_bytes(b"compiled-bytes")
    agent_server.route("POST", "/api/agent/v1/tasks/4/artifact-upload", Answer(200, {"method": "resumable"}))
    agent_server.route("POST", "/api/agent/v1/tasks/4/artifact", [Answer(502), Answer(201, {"sha256": "s"})])
    assert client.upload_artifact(4, attempt=3, path=artifact) == {"sha256": "s"}
    plan = agent_server.hits("POST", "/api/agent/v1/tasks/4/artifact-upload")[0].json()
    assert plan == {"attempt": 3, "sha256": hashlib.sha256(b"compiled-bytes").hexdigest(), "size_bytes": 14, "filename": "model.blob"}
    request = agent_server.hits("POST", "/api/agent/v1/tasks/4/artifact")[-1]
    assert request.json() == {"attempt": 3, "upload": "1", "filename": "model.blob"}
    assert bytes(agent_server.tus.uploads["1"]["data"]) == b"compiled-bytes"


def test_artifact_goes_to_a_presigned_url_without_the_agent_token_when_the_server_says_so(agent_server, client, tmp_path):
    artifact = tmp_path / "model.blob"
    artifact.write_bytes(b"compiled-bytes" * 100)
    # Another origin, as object storage is: same host, another port.
    storage = FakeAgentServer()
    storage.thread.start()
    try:
        put_path = "/bucket/incoming/x?X-Amz-Signature=abc"
        storage.route("PUT", put_path, [Answer(503), Answer(200)])
        agent_server.route("POST", "/api/agent/v1/tasks/4/artifact-upload", Answer(200, {
            "method": "PUT", "url": storage.url + put_path, "headers": {"x-amz-checksum-sha256": "c2hh"}, "staged": "token"}))
        agent_server.route("POST", "/api/agent/v1/tasks/4/artifact", Answer(201, {"sha256": "s"}))
        assert client.upload_artifact(4, attempt=3, path=artifact) == {"sha256": "s"}
        put = storage.hits("PUT", put_path)[-1]
        assert len(storage.hits("PUT", put_path)) == 2, "a 503 from storage is retried"
        assert put.body == artifact.read_bytes() and put.headers["x-amz-checksum-sha256"] == "c2hh"
        assert "Authorization" not in put.headers, "the agent token never goes to storage"
        assert agent_server.hits("POST", "/api/agent/v1/tasks/4/artifact")[-1].json() == {"attempt": 3, "staged": "token", "filename": "model.blob"}
        assert not agent_server.tus.uploads
    finally:
        storage.httpd.shutdown()


def test_a_download_redirected_to_storage_leaves_the_agent_token_behind(agent_server, client, tmp_path):
    data = b"model-bytes" * 1000
    storage = FakeAgentServer()
    storage.thread.start()
    try:
        storage.route("GET", "/bucket/ab/cd?X-Amz-Signature=abc", Answer(200, data))
        agent_server.route("GET", "/api/agent/v1/tasks/1/files/model", Answer(302, None, {"Location": storage.url + "/bucket/ab/cd?X-Amz-Signature=abc"}))
        assert client.download("/api/agent/v1/tasks/1/files/model", tmp_path / "model.onnx") == hashlib.sha256(data).hexdigest()
        assert "Authorization" in agent_server.hits("GET", "/api/agent/v1/tasks/1/files/model")[0].headers
        assert "Authorization" not in storage.hits("GET", "/bucket/ab/cd?X-Amz-Signature=abc")[0].headers
    finally:
        storage.httpd.shutdown()


def test_dropped_chunk_resumes_from_the_servers_offset(agent_server, client, tmp_path):
    from kiln_contract.resumable import upload_file

    data = bytes(range(256)) * 4096  # 1 MiB
    source = tmp_path / "engine.bin"
    source.write_bytes(data)
    agent_server.tus.drop_after = 300_000
    answer = upload_file(client, source, create_path="uploads", chunk_bytes=400_000)
    assert answer["sha256"] == hashlib.sha256(data).hexdigest()
    assert bytes(agent_server.tus.uploads["1"]["data"]) == data
    # The chunk after the drop starts where the server said it stood, not where the client was.
    offsets = [offset for offset, _ in agent_server.tus.patches]
    assert offsets[:2] == [0, 300_000]


def test_download_streams_to_disk_and_hashes(agent_server, client, tmp_path):
    data = bytes(range(256)) * 5000
    agent_server.route("GET", "/api/agent/v1/tasks/1/files/model", Answer(200, data))
    digest = client.download("/api/agent/v1/tasks/1/files/model", tmp_path / "model.onnx")
    assert digest == hashlib.sha256(data).hexdigest()
    assert (tmp_path / "model.onnx").read_bytes() == data
    assert not (tmp_path / "model.onnx.part").exists()
