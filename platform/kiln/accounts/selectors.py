"""Reads for accounts: who belongs where, and which token a secret is."""
from __future__ import annotations

from django.shortcuts import get_object_or_404

from kiln.core.tokens import digest_matches, split_token

from .models import ApiToken, Membership
from .services import API_TOKEN_PREFIX


def api_token_from_secret(*, secret: str) -> ApiToken | None:
    prefix = split_token(secret, API_TOKEN_PREFIX)
    if prefix is None:
        return None
    for token in ApiToken.objects.select_related("organization", "user").filter(lookup_prefix=prefix):
        if digest_matches(secret, token.digest):
            return token if token.is_active and token.user.is_active else None
    return None


def membership_get(*, user, organization_id: int) -> Membership | None:
    return Membership.objects.select_related("organization").filter(user=user, organization_id=organization_id).first()


def memberships_of(*, user) -> list[Membership]:
    return list(Membership.objects.select_related("organization").filter(user=user).order_by("organization__name"))


def api_tokens_of(*, user, organization) -> list[ApiToken]:
    return list(ApiToken.objects.filter(user=user, organization=organization).order_by("-created_at"))


def members_of(*, organization) -> list[Membership]:
    return list(Membership.objects.select_related("user").filter(organization=organization).order_by("user__username"))


def membership_in(*, organization, membership_id: int) -> Membership:
    return get_object_or_404(Membership.objects.select_related("user", "organization"), organization=organization, pk=membership_id)
