"""Reads for accounts: who belongs where, and which token a secret is."""
from __future__ import annotations

from django.shortcuts import get_object_or_404

from kiln.core.tokens import digest_matches, split_token, token_digest

from . import token_cache
from .models import ApiToken, Membership
from .services import API_TOKEN_PREFIX
from .token_cache import TokenGrant


def api_token_grant_from_secret(*, secret: str) -> TokenGrant | None:
    """The live token behind a secret and its user's membership: from this process's token cache
    (no query), else from the database (two queries). None: unknown, revoked, expired or its user
    deactivated."""
    prefix = split_token(secret, API_TOKEN_PREFIX)
    if prefix is None:
        return None
    digest = token_digest(secret)
    grant = token_cache.grant_cached(digest)
    if grant is None:
        looked_up_at = token_cache.lookup_started()
        token = _api_token_from_database(secret=secret, prefix=prefix)
        if token is None:
            return None
        grant = TokenGrant(digest=digest, token=token, membership=membership_get(user=token.user, organization_id=token.organization_id))
        token_cache.grant_remember(grant, looked_up_at)
    # Checked on every call: a remembered token expires on time.
    return grant if grant.token.is_active else None


def _api_token_from_database(*, secret: str, prefix: str) -> ApiToken | None:
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
