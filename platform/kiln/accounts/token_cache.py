"""API tokens behind their digests, remembered in this process for API_TOKEN_AUTH_CACHE_SECONDS.

A script or a dashboard calls with its token all the time; looking the token up (and the user's
membership in the token's organization) is two database queries per call. A grant remembered
here spares both. A revocation takes effect at once in every server process: when a token is
revoked, or its user's membership changes or ends, or the user is deactivated (through the
services, the Django admin or a shell), this process forgets the grant and every other one sees the
revocation generation change (kiln.core.revocations). An expired token is refused at once: its
expiry is checked on every call. The mechanics (digest keys, bounded size, jittered expiry, the
generation check) are kiln.core.token_cache's.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings

from kiln.core.revocations import revocation_generation
from kiln.core.token_cache import DigestCache, Lookup

from .models import ApiToken, Membership


@dataclass
class TokenGrant:
    """An API token as read (with its user and organization), and the user's membership there."""

    digest: str
    token: ApiToken
    membership: Membership | None  # None: the user is not a member of the token's organization


def _copy(grant: TokenGrant) -> TokenGrant:
    """A copy of the token, its user, its organization and the membership: a request may change its
    user (a sign-in stamps last_login); the remembered one stays as read. Four shallow copies: a
    deep copy of the same cost a tenth of the whole request."""
    token, organization = copy.copy(grant.token), copy.copy(grant.token.organization)
    token.user, token.organization = copy.copy(grant.token.user), organization
    membership = copy.copy(grant.membership)
    if membership is not None:
        membership.organization = organization
    return TokenGrant(digest=grant.digest, token=token, membership=membership)


_cache: DigestCache[TokenGrant] = DigestCache(lambda: settings.API_TOKEN_AUTH_CACHE_SECONDS, copier=_copy, generation=revocation_generation)

lookup_started = _cache.lookup_started


def _token_tag(token_id: int) -> tuple:
    return ("token", token_id)


def _membership_tag(user_id: int, organization_id: int) -> tuple:
    return ("membership", user_id, organization_id)


def grant_cached(digest: str) -> TokenGrant | None:
    """A copy of the grant remembered for this token digest, or None (unknown or expired)."""
    return _cache.get(digest)


def grant_remember(grant: TokenGrant, looked_up_at: Lookup) -> None:
    """Remember a grant read at `looked_up_at`, unless its token or membership was forgotten since."""
    token = grant.token
    _cache.remember(grant.digest, grant, (_token_tag(token.pk), _membership_tag(token.user_id, token.organization_id)), looked_up_at)


def grant_touched(grant: TokenGrant, at: datetime) -> None:
    """The token's last use was written at `at`: the remembered copy says so too (no write again for a minute)."""
    def stamp(remembered: TokenGrant) -> None:
        remembered.token.last_used_at = at

    _cache.update(grant.digest, stamp)


def token_forget(token_id: int) -> None:
    """Drop the grant of this token (revoked)."""
    _cache.forget(_token_tag(token_id))


def membership_forget(*, user_id: int, organization_id: int) -> None:
    """Drop the grants of this user's tokens for this organization (role changed, membership added or ended)."""
    _cache.forget(_membership_tag(user_id, organization_id))


def clear() -> None:
    _cache.clear()
