"""DRF authentication: API tokens for scripts, session + CSRF for the browser."""
from __future__ import annotations

from rest_framework import authentication, exceptions

from kiln.core.tokens import bearer_secret

from .selectors import api_token_grant_from_secret
from .services import api_token_touch

# Set on the request by ApiTokenAuthentication: the user's membership in the token's organization,
# read (or remembered) with the token, so that resolving the acting organization needs no query.
TOKEN_MEMBERSHIP_ATTRIBUTE = "token_membership"


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer kiln_pat_…`; the token fixes the organization."""

    def authenticate(self, request):
        secret = bearer_secret(request)
        if secret is None or not secret.startswith("kiln_pat_"):
            return None
        grant = api_token_grant_from_secret(secret=secret)
        if grant is None:
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked API token.")
        api_token_touch(grant=grant)
        setattr(request, TOKEN_MEMBERSHIP_ATTRIBUTE, grant.membership)
        return grant.token.user, grant.token

    def authenticate_header(self, request):
        return 'Bearer realm="kiln"'


class CsrfSessionAuthentication(authentication.SessionAuthentication):
    """Session auth that keeps DRF's CSRF check and answers 401 (not 403) when anonymous."""

    def authenticate_header(self, request):
        return 'Session realm="kiln"'
