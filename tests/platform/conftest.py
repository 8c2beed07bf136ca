"""Every JSON answer the API tests receive is checked against the OpenAPI schema (tests/platform/openapi_contract.py)."""
from __future__ import annotations

import pytest

from tests.platform.openapi_contract import check_answer


@pytest.fixture(autouse=True)
def answers_match_the_schema(monkeypatch):
    """Wrap the Django test client (DRF's APIClient is one): a documented answer of another shape, or an undocumented JSON
    answer, fails the test that received it."""
    from django.test.client import Client

    send = Client.request

    def request(self, **kwargs):
        response = send(self, **kwargs)
        if not getattr(response, "streaming", False):
            check_answer(method=response.request["REQUEST_METHOD"], path=response.request["PATH_INFO"], status=response.status_code,
                         content_type=response.get("Content-Type", ""), body=response.content)
        return response

    monkeypatch.setattr(Client, "request", request)
