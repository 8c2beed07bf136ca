"""Secret tokens: random, prefixed, shown once, stored as an HMAC-SHA256 digest."""
from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone

PUBLIC_PREFIX_CHARS = 8


@dataclass(frozen=True)
class IssuedToken:
    secret: str
    lookup_prefix: str
    digest: str


def token_digest(secret: str) -> str:
    return hmac.new(settings.TOKEN_HMAC_KEY.encode(), secret.encode(), hashlib.sha256).hexdigest()


def issue_token(kind_prefix: str) -> IssuedToken:
    """Make a new secret like `kiln_pat_<random>`; the public prefix finds its row."""
    body = secrets.token_urlsafe(32)
    secret = f"{kind_prefix}{body}"
    return IssuedToken(secret=secret, lookup_prefix=body[:PUBLIC_PREFIX_CHARS], digest=token_digest(secret))


def token_revoke(token):
    """Revoke a token row (an ApiToken, a RegistrationToken): `revoked_at` is set once, a second revoke keeps the first time."""
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token


def split_token(secret: str, kind_prefix: str) -> str | None:
    """Return the lookup prefix of a presented secret, or None if it is not of this kind."""
    if not secret.startswith(kind_prefix):
        return None
    body = secret[len(kind_prefix):]
    if len(body) < PUBLIC_PREFIX_CHARS:
        return None
    return body[:PUBLIC_PREFIX_CHARS]


def digest_matches(secret: str, digest: str) -> bool:
    return hmac.compare_digest(token_digest(secret), digest)


def bearer_secret(request) -> str | None:
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()
