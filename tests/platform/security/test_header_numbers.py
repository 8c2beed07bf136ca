"""Byte counts in tus headers are ASCII digits: Python's int() also reads "1_0", "+10", " 10" and
other scripts' digits, which a proxy in front (or the client's own check) reads differently."""
from __future__ import annotations

import pytest

from kiln.registry.models import Upload
from tests.platform.security.conftest import assert_json_error

pytestmark = pytest.mark.django_db

TUS = {"HTTP_TUS_RESUMABLE": "1.0.0"}
NOT_BYTE_COUNTS = ["1_0", "+10", " 10", "10 ", "١٠", "0x10", "1e1", "-0", "", "9" * 20]


@pytest.mark.parametrize("length", NOT_BYTE_COUNTS)
def test_an_upload_length_that_is_not_plain_digits_is_refused(tenant, length):
    response = tenant.client.post("/api/v1/uploads/", HTTP_UPLOAD_LENGTH=length, **TUS)
    body = assert_json_error(response, 400, "invalid_header")
    assert "Upload-Length" in body["error"]
    assert not Upload.objects.exists()


@pytest.mark.parametrize("offset", ["0_0", "+0", "٠"])
def test_an_upload_offset_that_is_not_plain_digits_is_refused(tenant, offset):
    url = tenant.client.post("/api/v1/uploads/", HTTP_UPLOAD_LENGTH="4", **TUS)["Location"]
    response = tenant.client.generic("PATCH", url, b"abcd", content_type="application/offset+octet-stream", HTTP_UPLOAD_OFFSET=offset, **TUS)
    assert_json_error(response, 400, "invalid_header")
    assert Upload.objects.get().offset == 0


def test_plain_digits_still_work(tenant):
    response = tenant.client.post("/api/v1/uploads/", HTTP_UPLOAD_LENGTH="0010", **TUS)
    assert response.status_code == 201, response.content
    assert response.json()["length"] == 10
