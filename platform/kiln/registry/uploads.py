"""Streaming uploads: hashed while written to disk, refused past the size limit."""
from __future__ import annotations

import hashlib

from django.conf import settings
from django.core.files.uploadhandler import TemporaryFileUploadHandler

from kiln.core.errors import upload_too_large


class HashingUploadHandler(TemporaryFileUploadHandler):
    """Always spool to a temp file, compute sha256 on the way, stop at the size limit."""

    def new_file(self, *args, **kwargs):
        super().new_file(*args, **kwargs)
        self.digest = hashlib.sha256()
        self.received = 0

    def receive_data_chunk(self, raw_data, start):
        self.received += len(raw_data)
        if self.received > settings.MAX_UPLOAD_BYTES:
            raise upload_too_large()
        self.digest.update(raw_data)
        return super().receive_data_chunk(raw_data, start)

    def file_complete(self, file_size):
        uploaded = super().file_complete(file_size)
        uploaded.sha256 = self.digest.hexdigest()
        return uploaded

