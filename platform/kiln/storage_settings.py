"""The blob storage settings, read from `KILN_S3_*`: S3-compatible storage when a bucket is named, the local folder otherwise.

A module of its own so that settings.py and the tests that start a real S3 server build the same thing.
"""
from __future__ import annotations

from collections.abc import Mapping

from django.core.exceptions import ImproperlyConfigured

LOCAL_BLOB_STORAGE = {"BACKEND": "kiln.registry.storage.LocalBlobStorage"}
MAX_PRESIGN_SECONDS = 3600


def _presign_seconds(env: Mapping[str, str]) -> int:
    raw = env.get("KILN_S3_PRESIGN_SECONDS") or "300"
    try:
        seconds = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"KILN_S3_PRESIGN_SECONDS must be an integer, got {raw!r}") from None
    if not 1 <= seconds <= MAX_PRESIGN_SECONDS:
        raise ImproperlyConfigured(f"KILN_S3_PRESIGN_SECONDS must be between 1 and {MAX_PRESIGN_SECONDS}: presigned URLs are meant to be short-lived.")
    return seconds


def blob_storage_settings(env: Mapping[str, str]) -> dict:
    """`S3_BUCKET`, `S3_ENDPOINT_URL`, `S3_PUBLIC_ENDPOINT_URL`, `S3_PRESIGN_SECONDS` and the `blobs` entry of STORAGES."""
    bucket = env.get("KILN_S3_BUCKET", "")
    given = sorted(name for name in env if name.startswith("KILN_S3_") and env[name])
    if given and not bucket:
        raise ImproperlyConfigured(f"{', '.join(given)} set without KILN_S3_BUCKET: set the bucket, or unset them to use the local folder.")
    access_key, secret_key = env.get("KILN_S3_ACCESS_KEY_ID") or None, env.get("KILN_S3_SECRET_ACCESS_KEY") or None
    if bool(access_key) != bool(secret_key):
        raise ImproperlyConfigured("Set both KILN_S3_ACCESS_KEY_ID and KILN_S3_SECRET_ACCESS_KEY, or neither (the AWS default credential chain).")
    endpoint = env.get("KILN_S3_ENDPOINT_URL") or None
    presign_seconds = _presign_seconds(env)
    values = {"S3_BUCKET": bucket, "S3_ENDPOINT_URL": endpoint, "S3_PUBLIC_ENDPOINT_URL": env.get("KILN_S3_PUBLIC_ENDPOINT_URL") or endpoint,
              "S3_PRESIGN_SECONDS": presign_seconds, "BLOB_STORAGE": LOCAL_BLOB_STORAGE}
    if bucket:
        values["BLOB_STORAGE"] = {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": {
            "bucket_name": bucket, "endpoint_url": endpoint, "region_name": env.get("KILN_S3_REGION") or "us-east-1",
            "access_key": access_key, "secret_key": secret_key, "location": (env.get("KILN_S3_PREFIX") or "").strip("/"),
            "signature_version": "s3v4", "addressing_style": "path" if endpoint else None, "file_overwrite": True,
            "default_acl": None, "querystring_expire": presign_seconds,
        }}
    return values
