"""Writes for users, organizations, memberships and API tokens."""
from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from kiln.core.errors import KilnError
from kiln.core.tokens import issue_token

from .models import ApiToken, Membership, Organization, Role

API_TOKEN_PREFIX = "kiln_pat_"


def organization_get_or_create(*, name: str) -> Organization:
    slug = slugify(name)[:100] or "org"
    organization, _ = Organization.objects.get_or_create(slug=slug, defaults={"name": name})
    return organization


def membership_ensure(*, user, organization: Organization, role: str = Role.MEMBER) -> Membership:
    membership, _ = Membership.objects.get_or_create(user=user, organization=organization, defaults={"role": role})
    return membership


@transaction.atomic
def user_signup(*, username: str, password: str, organization_name: str):
    """Create a user and a new organization they own."""
    User = get_user_model()
    username = (username or "").strip()
    organization_name = (organization_name or "").strip()
    if not username or not organization_name:
        raise KilnError("username, password and organization are required.", code="invalid")
    if User.objects.filter(username__iexact=username).exists():
        raise KilnError("That username is taken.", code="username_taken")
    if Organization.objects.filter(slug=slugify(organization_name)).exists():
        raise KilnError("An organization with that name exists; ask its owner to invite you.", code="organization_taken")
    try:
        validate_password(password)
    except Exception as exc:  # django's ValidationError carries the messages users need
        raise KilnError(" ".join(getattr(exc, "messages", [str(exc)])), code="weak_password") from exc
    user = User.objects.create_user(username=username, password=password)
    organization = organization_get_or_create(name=organization_name)
    membership_ensure(user=user, organization=organization, role=Role.OWNER)
    return user


def api_token_create(*, user, organization: Organization, name: str, expires_in_days: int | None = None) -> tuple[ApiToken, str]:
    """Create an API token; the secret is returned once and only its digest is kept."""
    issued = issue_token(API_TOKEN_PREFIX)
    expires_at = timezone.now() + timedelta(days=expires_in_days) if expires_in_days else None
    token = ApiToken.objects.create(
        organization=organization,
        user=user,
        name=name or "token",
        lookup_prefix=issued.lookup_prefix,
        digest=issued.digest,
        expires_at=expires_at,
    )
    return token, issued.secret


def api_token_revoke(*, token: ApiToken) -> ApiToken:
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token


def api_token_touch(*, token: ApiToken) -> None:
    """Record last use, at most once a minute, so reads don't turn into writes on every call."""
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > timedelta(minutes=1):
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)


def _owners_left(organization: Organization, *, excluding: Membership) -> int:
    return Membership.objects.filter(organization=organization, role=Role.OWNER).exclude(pk=excluding.pk).count()


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
    return Membership.objects.create(user=user, organization=organization, role=role)


@transaction.atomic
def membership_change_role(*, membership: Membership, role: str) -> Membership:
    if role not in Role.values:
        raise KilnError(f"role must be one of {', '.join(Role.values)}.", code="invalid_role")
    if membership.role == Role.OWNER and role != Role.OWNER and not _owners_left(membership.organization, excluding=membership):
        raise KilnError("An organization keeps at least one owner.", code="last_owner", status_code=409)
    membership.role = role
    membership.save(update_fields=["role"])
    return membership


@transaction.atomic
def membership_remove(*, membership: Membership) -> None:
    if membership.role == Role.OWNER and not _owners_left(membership.organization, excluding=membership):
        raise KilnError("An organization keeps at least one owner.", code="last_owner", status_code=409)
    ApiToken.objects.filter(user=membership.user, organization=membership.organization, revoked_at__isnull=True).update(revoked_at=timezone.now())
    membership.delete()
