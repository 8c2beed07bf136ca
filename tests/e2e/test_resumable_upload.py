"""An interrupted 1 GiB upload resumes and completes with the right digest, while the server's memory stays flat.

The server is gunicorn in its own process (as `make up` runs it), so its RSS is measured alone.
A TCP proxy between the client and the server cuts the connection once, mid-chunk; the client
asks the server where it stands and goes on. KILN_TEST_RESUMABLE_BYTES changes the size.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest

from tests.conftest import REPO, _database_url_for_children, make_tenant, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

SIZE = int(os.environ.get("KILN_TEST_RESUMABLE_BYTES", str(1024**3)))
RSS_GROWTH_LIMIT_MB = 150


class DroppingProxy:
    """Forwards TCP connections to `upstream`; the first time `drop_after` request bytes have passed, it cuts that connection."""

    def __init__(self, upstream: int, drop_after: int):
        self.upstream, self.drop_after = upstream, drop_after
        self.forwarded = 0
        self.dropped = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, upstream: bool) -> None:
        try:
            while data := source.recv(1 << 20):
                target.sendall(data)
                if upstream and not self.dropped.is_set():
                    self.forwarded += len(data)
                    if self.forwarded >= self.drop_after:
                        self.dropped.set()
                        break
        except OSError:
            pass
        for sock in (source, target):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.listener.close()


class RssSampler:
    """The peak resident memory of a process and its children, sampled every 50 ms."""

    def __init__(self, pid: int):
        self.process = psutil.Process(pid)
        self.peak = self.baseline = self.current()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def current(self) -> int:
        return sum(p.memory_info().rss for p in [self.process, *self.process.children(recursive=True)])

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            self.peak = max(self.peak, self.current())

    def __enter__(self):
        self.baseline = self.peak = self.current()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


@pytest.fixture
def gunicorn(transactional_db, tmp_path, settings):
    from django.conf import settings as django_settings

    port = socket.create_server(("127.0.0.1", 0))
    number = port.getsockname()[1]
    port.close()
    env = {**os.environ, "DATABASE_URL": _database_url_for_children(), "KILN_DATA_DIR": str(django_settings.DATA_DIR),
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "platform")])}
    log = open(tmp_path / "gunicorn.log", "ab")
    process = subprocess.Popen([sys.executable, "-m", "gunicorn", "kiln.wsgi:application", "--bind", f"127.0.0.1:{number}", "--workers", "1",
                                "--threads", "4", "--timeout", "300", "--chdir", str(REPO / "platform")], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{number}"
    import requests

    def up():
        try:
            return requests.get(url + "/api/v1/health/", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    try:
        wait_until(up, timeout=60, message="gunicorn to answer")
        yield process, number
    finally:
        process.terminate()
        process.wait(timeout=30)


def _write_file(path, size: int) -> str:
    """`size` bytes of incompressible data; returns their sha256."""
    digest = hashlib.sha256()
    block = np.random.default_rng(0).bytes(16 * 1024 * 1024)
    with open(path, "wb") as handle:
        written = 0
        while written < size:
            piece = block[: size - written]
            # Each block differs, so nothing upstream could deduplicate it.
            piece = written.to_bytes(8, "little") + piece[8:]
            handle.write(piece)
            digest.update(piece)
            written += len(piece)
    return digest.hexdigest()


def test_interrupted_gigabyte_upload_resumes_with_the_right_digest_and_flat_memory(gunicorn, tmp_path, capsys):
    from kiln.registry.models import Blob
    from kiln.registry.storage import delete_file, local_path
    from kiln_client.client import Client

    process, port = gunicorn
    tenant = make_tenant(username="big", organization="Big Files")
    source = tmp_path / "big.bin"
    expected = _write_file(source, SIZE)
    # Cut the connection 40% in, in the middle of the second chunk.
    proxy = DroppingProxy(port, drop_after=int(SIZE * 0.4))
    client = Client(f"http://127.0.0.1:{proxy.port}", tenant.token)
    client.sleep = lambda seconds: None
    seen = []
    started = time.monotonic()
    with RssSampler(process.pid) as rss:
        answer = client.upload(source, chunk_bytes=max(1, SIZE // 4), progress=lambda done, total: seen.append(done))
    wall_s = time.monotonic() - started
    proxy.close()
    growth_mb = (rss.peak - rss.baseline) / 1024**2
    with capsys.disabled():
        print(f"\nresumable upload of {SIZE / 1024**2:.0f} MiB: {wall_s:.1f} s, server RSS {rss.baseline / 1024**2:.0f} MiB -> peak "
              f"{rss.peak / 1024**2:.0f} MiB (growth {growth_mb:.1f} MiB), connection cut at {proxy.forwarded / 1024**2:.0f} MiB")
    assert proxy.dropped.is_set(), "the proxy never cut the connection: nothing was resumed"
    # The chunk after the cut started at the server's offset (inside the second chunk), not at a chunk boundary.
    assert any(done % (SIZE // 4) > 0 for done in seen[1:-1]), seen
    assert answer["complete"] is True and answer["sha256"] == expected
    blob = Blob.objects.get(organization=tenant.organization, sha256=expected)
    assert blob.size_bytes == SIZE and local_path(expected).stat().st_size == SIZE
    assert growth_mb < RSS_GROWTH_LIMIT_MB
    delete_file(expected)
