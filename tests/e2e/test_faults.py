"""Faults survived with real processes: a Celery worker killed mid-build, an agent's network cut
for longer than its lease, the disk filling during an upload."""
from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kiln.pipeline.models import Artifact, ArtifactKind, DeviceTask, DeviceTaskPurpose, DeviceTaskStatus, JobEvent, Variant, VariantStatus
from kiln.registry.models import Blob, Model
from tests.conftest import celery_worker_command, upload, wait_until
from tests.e2e.test_pipeline_stack import Api, upload_digits

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]


@pytest.fixture
def short_work_leases(monkeypatch):
    """Worker processes started after this renew a 3 s work lease: a dead worker shows within seconds.

    A build message the killed worker had prefetched stays unacknowledged in Redis (until its
    visibility timeout, an hour); its offered lease lapses after the queue grace and it is re-sent.
    """
    monkeypatch.setenv("KILN_WORK_LEASE_SECONDS", "3")
    monkeypatch.setenv("KILN_WORK_QUEUE_GRACE_SECONDS", "20")


def test_celery_worker_killed_mid_build_the_job_completes_with_each_variant_built_once(short_work_leases, kiln_stack, model_files, tmp_path):
    tenant = kiln_stack.create_user("dora", "a-long-password-1", "Doras")
    api = Api(kiln_stack.url, tenant.token)
    ids = upload_digits(api, model_files)
    kiln_stack.start_agent(tenant, "board", backends="onnxruntime")
    job = api.post("/api/v1/jobs/", json={"model_version": ids["version"], "precisions": ["fp32", "int8-dynamic", "fp16"]})
    worker = kiln_stack.processes[0]
    try:
        building = wait_until(lambda: Variant.objects.filter(job_id=job["id"], status=VariantStatus.BUILDING).exclude(build_lease_owner="").first(),
                              timeout=180, interval=0.05, message="a variant build to start")
    except AssertionError:
        print(api.get(f"/api/v1/jobs/{job['id']}/").json(), kiln_stack.logs())
        raise
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()
    kiln_stack.spawn("worker-2", celery_worker_command(tmp_path / "celerybeat-schedule-2"), {"KILN_HOUSEKEEPING_SECONDS": "1"})

    finished = api.wait_for_job(job["id"], kiln_stack, timeout=240)
    assert finished["status"] == "succeeded", (finished["events"], kiln_stack.logs())
    variants = list(Variant.objects.filter(job_id=job["id"]))
    assert sorted(v.precision for v in variants) == ["fp16", "fp32", "int8-dynamic"]
    for variant in variants:
        assert variant.status == VariantStatus.READY
        assert Artifact.objects.filter(job_id=job["id"], kind=ArtifactKind.VARIANT, name__startswith=f"{variant.key}.").count() == 1
        assert JobEvent.objects.filter(job_id=job["id"], message=f"Built {variant.key} ({variant.artifact.blob.size_bytes} bytes).").count() <= 1
        # Measured once; the side-by-side re-timing of the finalists is a task of its own (kiln.pipeline.retime).
        assert DeviceTask.objects.filter(job_id=job["id"], variant=variant, purpose=DeviceTaskPurpose.MEASURE).count() == 1
    # The killed build was sent again once, by the reaper, and finished by the second worker.
    again = JobEvent.objects.filter(job_id=job["id"], message__contains=f"build of {building.key} was sent again")
    assert again.count() == 1 and Variant.objects.get(pk=building.pk).build_attempts == 2


class CuttableProxy:
    """A TCP proxy in front of the server whose link can be cut (every connection dropped, new ones refused)."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.cut = threading.Event()
        self.statuses: list[int] = []
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.cut.is_set():
                client.close()
                continue
            server = socket.create_connection(self.upstream)
            self.sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        peers = {client: server, server: client}
        try:
            while not self.cut.is_set():
                ready, _, _ = select.select(list(peers), [], [], 0.2)
                for source in ready:
                    data = source.recv(65536)
                    if not data:
                        return
                    if source is server and data.startswith(b"HTTP/1.1 "):
                        self.statuses.append(int(data[9:12]))
                    peers[source].sendall(data)
        except OSError:
            pass
        finally:
            client.close()
            server.close()

    def set_cut(self, cut: bool) -> None:
        if cut:
            self.cut.set()
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        else:
            self.cut.clear()


def test_agent_cut_off_beyond_its_lease_the_task_runs_once_more_elsewhere_and_its_late_result_is_409(kiln_stack, model_files, settings):
    settings.BENCHMARK_MIN_SECONDS = 6
    tenant = kiln_stack.create_user("erin", "a-long-password-1", "Erins")
    api = Api(kiln_stack.url, tenant.token)
    ids = upload_digits(api, model_files)
    host, port = kiln_stack.url.removeprefix("http://").split(":")
    proxy = CuttableProxy((host, int(port)))
    # The first agent reaches the server only through the proxy.
    kiln_stack.url, direct = proxy.url, kiln_stack.url
    kiln_stack.start_agent(tenant, "cut-off", labels={"pool": "y"}, backends="onnxruntime")
    kiln_stack.url = direct
    job = api.post("/api/v1/jobs/", json={"model_version": ids["version"], "precisions": ["fp32"], "targets": ["pool=y"],
                                          "validation_dataset": ids["validation"]})
    task = wait_until(lambda: DeviceTask.objects.filter(job_id=job["id"], stage="benchmark").first(), timeout=120, message="the task to be benchmarking")
    proxy.set_cut(True)
    # Longer than the lease (8 s in the stack): the beat requeues it; a second agent takes it.
    wait_until(lambda: DeviceTask.objects.get(pk=task.pk).status == DeviceTaskStatus.QUEUED, timeout=60, message="the lease to expire")
    settings.BENCHMARK_MIN_SECONDS = 0.3
    kiln_stack.start_agent(tenant, "second", labels={"pool": "y"}, backends="onnxruntime")
    finished = api.wait_for_job(job["id"], kiln_stack)
    assert finished["status"] == "succeeded", (finished["events"], kiln_stack.logs())
    proxy.set_cut(False)
    # Back online, the first agent finishes its benchmark and posts the stale attempt's result.
    wait_until(lambda: 409 in proxy.statuses, timeout=90, message="the late result to be answered 409")
    task.refresh_from_db()
    assert task.status == DeviceTaskStatus.SUCCEEDED and task.attempt == 2 and task.leased_by.name == "second"
    assert DeviceTask.objects.filter(job_id=job["id"]).count() == 1
    assert sum("lost its agent" in event["message"] for event in finished["events"]) == 1


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 1 MiB filesystem (tmpfs): writes past it fail with ENOSPC."""
    mount = tmp_path / "disk"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=False)


def wide_matmul(*, inputs: int, outputs: int) -> onnx.ModelProto:
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((inputs, outputs)).astype(np.float32), "weight")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "weight"], ["output"])], "wide",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, inputs])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, outputs])], [weight],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def files_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()]


@pytest.mark.django_db
@pytest.mark.parametrize("full", ["upload spool", "blob store"])
def test_disk_full_during_an_upload_is_507_with_no_partial_blob_and_no_row(tenant, tiny_disk, settings, tmp_path, full):
    big = tmp_path / "big.onnx"
    onnx.save(wide_matmul(inputs=400, outputs=1000), big)  # 1.6 MB of weights: larger than the disk
    if full == "upload spool":
        settings.FILE_UPLOAD_TEMP_DIR = str(tiny_disk)
        settings.BLOB_ROOT = tmp_path / "blobs"
    else:
        settings.BLOB_ROOT = tiny_disk / "blobs"
    response = upload(tenant.client, "/api/v1/models/", big)
    assert response.status_code == 507, response.content
    assert response.json()["code"] == "storage_full"
    assert files_under(tiny_disk) == []
    assert Model.objects.count() == 0 and Blob.objects.count() == 0
