"""Numbers out of range (huge floats, ids past 64 bits, thousands of digits) are 400s, not 500s."""
from __future__ import annotations

import pytest

from kiln.pipeline.models import DeploymentJob
from tests.platform.security.conftest import assert_json_error

pytestmark = pytest.mark.django_db
# Tests that lease run transactional: the lease long-poll reads the database from its own thread.
LEASES = pytest.mark.django_db(transaction=True)

HUGE = "1" + "0" * 400
DIGITS_5000 = "9" * 5000


@pytest.mark.parametrize(
    "tolerance",
    [
        '{"metric": "cosine", "max_drop": 1e400}',
        '{"metric": "cosine", "max_drop": -1e400}',
        '{"metric": "cosine", "max_drop": %s}' % HUGE,
        '{"metric": "sqnr", "min_value": 1e400}',
        '{"metric": "sqnr", "min_value": %s}' % HUGE,
        '{"metric": "cosine", "max_drop": "1e400"}',
        '{"metric": "sqnr", "min_value": "%s"}' % HUGE,
        '{"metric": "cosine", "max_drop": "%s"}' % DIGITS_5000,
    ],
)
def test_tolerance_numbers_out_of_range_are_400(tenant, model_version, tolerance):
    payload = '{"model_version": %d, "precisions": ["fp32"], "tolerance": %s}' % (model_version, tolerance)
    response = tenant.client.post("/api/v1/jobs/", payload, content_type="application/json")
    assert_json_error(response, 400)
    assert DeploymentJob.objects.count() == 0


@pytest.mark.parametrize("target", [str(2**70), f'"{2**70}"', f'"{DIGITS_5000}"', DIGITS_5000, "0", '"-5"', '"٣"'])
def test_target_ids_out_of_range_are_400(tenant, model_version, target):
    payload = '{"model_version": %d, "precisions": ["fp32"], "targets": [%s]}' % (model_version, target)
    response = tenant.client.post("/api/v1/jobs/", payload, content_type="application/json")
    assert_json_error(response, 400)
    assert DeploymentJob.objects.count() == 0


@pytest.mark.parametrize("field", ["model_version", "calibration_dataset", "validation_dataset"])
@pytest.mark.parametrize("value", [str(2**70), f'"{2**70}"', f'"{DIGITS_5000}"'])
def test_object_ids_out_of_range_are_400(tenant, model_version, field, value):
    fields = {"model_version": str(model_version), field: value}
    payload = "{" + ", ".join(f'"{key}": {val}' for key, val in fields.items()) + ', "precisions": ["fp32"]}'
    assert_json_error(tenant.client.post("/api/v1/jobs/", payload, content_type="application/json"), 400)
    assert DeploymentJob.objects.count() == 0


@pytest.mark.parametrize("value", [str(2**70), f'"{2**70}"', f'"{DIGITS_5000}"', "-1"])
def test_organization_switch_with_huge_ids_is_400(tenant, value):
    response = tenant.client.post("/api/v1/auth/organization/", f'{{"organization": {value}}}', content_type="application/json")
    assert_json_error(response, 400)


@pytest.mark.parametrize(
    "path",
    [
        f"/api/v1/models/{2**70}/",
        f"/api/v1/jobs/{2**70}/report/",
        f"/api/v1/artifacts/{DIGITS_5000}/download/",
        f"/api/v1/datasets/{2**64}/",
        f"/api/v1/members/{2**63}/",
    ],
)
def test_ids_in_paths_past_64_bits_are_json_404(tenant, path):
    assert_json_error(tenant.client.get(path), 404, "not_found")


def test_largest_real_id_still_routes(tenant):
    # 18 digits is the most an id may have; it routes to the view, which answers a plain 404.
    assert_json_error(tenant.client.get("/api/v1/models/999999999999999999/"), 404, "not_found")


@LEASES
def test_progress_percent_out_of_range_is_400(agent, leased_task):
    url = f"/api/agent/v1/tasks/{leased_task['id']}/progress"
    for percent in (1e300, -1, "nan", "inf"):
        response = agent.post(url, {"attempt": leased_task["attempt"], "stage": "compile", "percent": percent}, format="json")
        assert_json_error(response, 400)
    ok = agent.post(url, {"attempt": leased_task["attempt"], "stage": "compile", "percent": 50}, format="json")
    assert ok.status_code == 200
