"""Writes for users, organizations, memberships and API tokens."""
from __future__ import annotations

import secrets
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify

from kiln.core.errors import KilnError
from kiln.core.revocations import revocations_announce
from kiln.core.tokens import issue_token, token_revoke

from . import token_cache
from .models import ApiToken, Membership, Organization, Role
from .token_cache import TokenGrant

API_TOKEN_PREFIX = "kiln_pat_"
SLUG_BASE_LENGTH = 100
SLUG_ATTEMPTS = 8


def organization_slug(name: str) -> str:
    """The URL-safe base slug of an organization name; Unicode letters are kept ("Ωμέγα" → "ωμέγα")."""
    return slugify(name, allow_unicode=True)[:SLUG_BASE_LENGTH] or "org"


def organization_create(*, name: str) -> Organization:
    """Create a new organization, always: a taken slug gets a random suffix, never a shared row."""
    base = organization_slug(name)
    slug = base
    for _ in range(SLUG_ATTEMPTS):
        if not Organization.objects.filter(slug=slug).exists():
            try:
                # A savepoint: losing a race for the slug must not break the caller's transaction.
                with transaction.atomic():
                    return Organization.objects.create(slug=slug, name=name)
            except IntegrityError:
                pass
        slug = f"{base}-{secrets.token_hex(3)}"
    raise KilnError("Could not find a free name for the organization; try again.", code="organization_slug", status_code=503)


def organization_get_or_create(*, name: str) -> Organization:
    """The organization with this name's base slug, created if missing: for operators' commands
    (`create_api_token`, the demo account), never for sign-up, which always creates its own."""
    organization = Organization.objects.filter(slug=organization_slug(name)).first()
    return organization or organization_create(name=name)


def membership_ensure(*, user, organization: Organization, role: str = Role.MEMBER) -> Membership:
    membership, _ = Membership.objects.get_or_create(user=user, organization=organization, defaults={"role": role})
    return membership


@transaction.atomic
def user_signup(*, username: str, password: str, organization_name: str):
    """Create a user and a new organization they own; joining an existing one is only ever an
    owner's act (`membership_add`)."""
    User = get_user_model()
    username = (username or "").strip()
    organization_name = (organization_name or "").strip()
    if not username or not organization_name:
        raise KilnError("username, password and organization are required.", code="invalid")
    if User.objects.filter(username__iexact=username).exists():
        raise KilnError("That username is taken.", code="username_taken")
    try:
        validate_password(password)
    except Exception as exc:  # django's ValidationError carries the messages users need
        raise KilnError(" ".join(getattr(exc, "messages", [str(exc)])), code="weak_password") from exc
    user = User.objects.create_user(username=username, password=password)
    organization = organization_create(name=organization_name)
    Membership.objects.create(user=user, organization=organization, role=Role.OWNER)
    return user


def api_token_create(*, user, organization: Organization, name: str, expires_in_days: int | None = None,
                     created_by_token: ApiToken | None = None) -> tuple[ApiToken, str]:
    """Create an API token; the secret is returned once and only its digest is kept.

    A token made with a token (`created_by_token`) expires no later than it and is revoked with it
    (api_token_revoke): a stolen token cannot leave tokens behind that outlive its revocation.
    """
    issued = issue_token(API_TOKEN_PREFIX)
    expires_at = timezone.now() + timedelta(days=expires_in_days) if expires_in_days else None
    with transaction.atomic():
        if created_by_token is not None:
            # Locked: a revocation of the maker either sees this token or comes first and refuses it.
            maker = ApiToken.objects.select_for_update().get(pk=created_by_token.pk)
            if not maker.is_active:
                raise KilnError("The token this request came with was revoked or expired.", code="token_revoked", status_code=401)
            if maker.expires_at is not None and (expires_at is None or expires_at > maker.expires_at):
                expires_at = maker.expires_at
        token = ApiToken.objects.create(
            organization=organization,
            user=user,
            name=name or "token",
            lookup_prefix=issued.lookup_prefix,
            digest=issued.digest,
            expires_at=expires_at,
            created_by_token=created_by_token,
        )
    return token, issued.secret


def api_token_revoke(*, token: ApiToken) -> ApiToken:
    """Revoke a token and every token made with it (and theirs); every server process refuses them at
    once (kiln.core.revocations announces the change when it commits)."""
    with transaction.atomic():
        ApiToken.objects.select_for_update().filter(pk=token.pk).first()
        token_revoke(token)
        revoked = [token.pk, *_tokens_made_by(token.pk)]
        if ApiToken.objects.filter(pk__in=revoked, revoked_at__isnull=True).update(revoked_at=token.revoked_at):
            revocations_announce()  # a bulk update sends no signal
    for token_id in revoked:
        token_cache.token_forget(token_id)
    return token


def _tokens_made_by(token_id: int) -> list[int]:
    """The ids of the tokens made with this token, and with those, all the way down."""
    found, frontier = [], [token_id]
    while frontier:
        frontier = list(ApiToken.objects.filter(created_by_token_id__in=frontier).values_list("pk", flat=True))
        found.extend(frontier)
    return found


def api_token_touch(*, grant: TokenGrant) -> None:
    """Record last use, at most once a minute, so reads don't turn into writes on every call."""
    now = timezone.now()
    token = grant.token
    if token.last_used_at is None or now - token.last_used_at > timedelta(minutes=1):
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
        token_cache.grant_touched(grant, now)


def _owners_left(organization: Organization, *, excluding: Membership) -> int:
    return Membership.objects.filter(organization=organization, role=Role.OWNER).exclude(pk=excluding.pk).count()


def _membership_changed(membership: Membership) -> None:
    """This process forgets the user's token grants for the organization at once; the others within
    API_TOKEN_AUTH_CACHE_SECONDS. Call after the change is committed."""
    token_cache.membership_forget(user_id=membership.user_id, organization_id=membership.organization_id)


def membership_add(*, organization: Organization, username: str, role: str) -> Membership:
    """Add an existing user to the organization with a role."""
    User = get_user_model()
    if role not in Role.values:
        raise KilnError(f"role must be one of {', '.join(Role.values)}.", code="invalid_role")
    user = User.objects.filter(username__iexact=(username or "").strip(), is_active=True).first()
    if user is None:
        raise KilnError("No user has that name; they sign up first, then you add them.", code="unknown_user")
    if Membership.objects.filter(user=user, organization=organization).exists():
        raise KilnError(f"{user.username} is already a member.", code="already_member", status_code=409)
    membership = Membership.objects.create(user=user, organization=organization, role=role)
    _membership_changed(membership)
    return membership


def membership_change_role(*, membership: Membership, role: str) -> Membership:
    if role not in Role.values:
        raise KilnError(f"role must be one of {', '.join(Role.values)}.", code="invalid_role")
    with transaction.atomic():
        if membership.role == Role.OWNER and role != Role.OWNER and not _owners_left(membership.organization, excluding=membership):
            raise KilnError("An organization keeps at least one owner.", code="last_owner", status_code=409)
        membership.role = role
        membership.save(update_fields=["role"])
    _membership_changed(membership)
    return membership


def membership_remove(*, membership: Membership) -> None:
    with transaction.atomic():
        if membership.role == Role.OWNER and not _owners_left(membership.organization, excluding=membership):
            raise KilnError("An organization keeps at least one owner.", code="last_owner", status_code=409)
        ApiToken.objects.filter(user=membership.user, organization=membership.organization, revoked_at__isnull=True).update(revoked_at=timezone.now())
        membership.delete()
    _membership_changed(membership)
