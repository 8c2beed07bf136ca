"""Expired uploads go on the beat schedule, in a real Celery worker running beat, for an organization
that never opens another upload: the row, the part file and a finished upload's blob."""
from __future__ import annotations

import hashlib
import os
import subprocess
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from kiln.registry import storage, uploads
from kiln.registry.models import Blob, Upload
from kiln.registry.services import upload_append, upload_create
from tests.conftest import REPO, _database_url_for_children, celery_worker_command, make_tenant, wait_until
from workers.celery import app as celery_app

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


class Body:
    def __init__(self, data: bytes):
        self.data = data

    def read(self, size: int) -> bytes:
        chunk, self.data = self.data[:size], self.data[size:]
        return chunk


def test_the_beat_expires_uploads_nobody_touches_again(tmp_path):
    tenant = make_tenant(username="ursula", organization="Quiet")
    data = b"finished and never used"
    finished = upload_create(organization=tenant.organization, owner="user:1", length=len(data),
                             metadata={"sha256": hashlib.sha256(data).hexdigest(), "filename": "x.bin"})
    upload_append(upload=finished, offset=0, stream=Body(data), length=len(data))
    half = upload_create(organization=tenant.organization, owner="user:1", length=10, metadata={})
    upload_append(upload=half, offset=0, stream=Body(b"abcd"), length=4)
    Upload.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    sha = hashlib.sha256(data).hexdigest()
    assert storage.blob_exists(sha) and uploads.part_path(half.id).exists()

    celery_app.control.purge()
    env = {**os.environ, "DATABASE_URL": _database_url_for_children(), "KILN_DATA_DIR": str(settings.DATA_DIR),
           "KILN_HOUSEKEEPING_SECONDS": "1", "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "platform")]),
           "KILN_BLOB_ROOT": str(settings.BLOB_ROOT)}
    env.pop("KILN_CELERY_EAGER", None)
    log = open(tmp_path / "worker.log", "wb")
    worker = subprocess.Popen(celery_worker_command(tmp_path / "beat-schedule"), env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        wait_until(lambda: not Upload.objects.exists(), timeout=120, message=f"the beat to expire the uploads\n{(tmp_path / 'worker.log').read_text()[-3000:]}")
        wait_until(lambda: not Blob.objects.exists() and not storage.blob_exists(sha), timeout=30, message="the blob to go")
        assert not uploads.part_path(half.id).exists()
    finally:
        os.killpg(worker.pid, 15)
        worker.wait(timeout=30)
        celery_app.control.purge()
