"""Sign-up always creates a new organization: nobody joins another tenant by choosing its name."""
from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from kiln.accounts.models import Membership, Organization
from tests.conftest import make_tenant

pytestmark = pytest.mark.django_db

PASSWORD = "correct-horse-battery"


def _signup(username: str, organization: str):
    client = APIClient()
    response = client.post("/api/v1/auth/signup/", {"username": username, "password": PASSWORD, "organization": organization}, format="json")
    return client, response


def _organization_of(username: str) -> Organization:
    return Membership.objects.get(user__username=username).organization


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("Ωμέγα", "Δέλτα"),  # non-Latin names used to slugify to nothing, then to the same "org"
        ("☃☃☃", "★★★"),  # names with no letters at all
        ("Ωμέγα", "Ωμέγα"),  # the same Unicode name twice
        ("Acme", "acme"),  # the same slug from two spellings
        ("x" * 100 + "-first", "x" * 100 + "-second"),  # long names that share a 100-character prefix
    ],
)
def test_second_signup_gets_its_own_organization(first, second):
    _, one = _signup("first-user", first)
    client_two, two = _signup("second-user", second)
    assert one.status_code == 201, one.json()
    assert two.status_code == 201, two.json()
    org_one, org_two = _organization_of("first-user"), _organization_of("second-user")
    assert org_one.pk != org_two.pk
    assert org_one.slug != org_two.slug
    assert two.json()["organization"]["id"] == org_two.pk
    # The second user sees nothing of the first organization, and is alone in their own.
    assert Membership.objects.filter(organization=org_one).count() == 1
    assert Membership.objects.filter(organization=org_two).count() == 1
    assert [o["id"] for o in two.json()["organizations"]] == [org_two.pk]
    switch = client_two.post("/api/v1/auth/organization/", {"organization": org_one.pk}, format="json")
    assert switch.status_code == 404


def test_signup_never_joins_an_organization_made_by_an_operator():
    existing = make_tenant(username="owner", organization="Ωμέγα")
    _, response = _signup("intruder", "Ωμέγα")
    assert response.status_code == 201
    assert _organization_of("intruder").pk != existing.organization.pk
    assert list(Membership.objects.filter(organization=existing.organization).values_list("user__username", flat=True)) == ["owner"]


def test_unicode_names_keep_readable_slugs():
    _, response = _signup("greek", "Ωμέγα Labs")
    assert response.json()["organization"]["slug"] == "ωμέγα-labs"
    assert response.json()["organization"]["name"] == "Ωμέγα Labs"


def test_joining_an_existing_organization_takes_its_owner():
    owner = make_tenant(username="boss", organization="Team")
    _signup("newcomer", "Somewhere")
    member = make_tenant(username="bystander", organization="Team", role="member")
    refused = member.client.post("/api/v1/members/", {"username": "newcomer", "role": "owner"}, format="json")
    assert refused.status_code == 403
    added = owner.client.post("/api/v1/members/", {"username": "newcomer", "role": "member"}, format="json")
    assert added.status_code == 201
    assert Membership.objects.get(user__username="newcomer", organization=owner.organization).role == "member"
