"""Organization scoping: every API request acts inside exactly one organization."""
from __future__ import annotations

from rest_framework import permissions

from .authentication import TOKEN_MEMBERSHIP_ATTRIBUTE
from .models import ApiToken, Role
from .selectors import membership_get, memberships_of

SESSION_ORGANIZATION_KEY = "kiln_organization_id"


def resolve_membership(request):
    """The membership the request acts as: the token's organization, or the session's choice."""
    user = request.user
    if not user or not user.is_authenticated:
        return None
    if isinstance(request.auth, ApiToken):
        if hasattr(request, TOKEN_MEMBERSHIP_ATTRIBUTE):  # read with the token by ApiTokenAuthentication
            return getattr(request, TOKEN_MEMBERSHIP_ATTRIBUTE)
        return membership_get(user=user, organization_id=request.auth.organization_id)
    chosen = request.session.get(SESSION_ORGANIZATION_KEY) if hasattr(request, "session") else None
    if chosen is not None:
        membership = membership_get(user=user, organization_id=chosen)
        if membership is not None:
            return membership
    memberships = memberships_of(user=user)
    return memberships[0] if memberships else None


class IsOrganizationMember(permissions.BasePermission):
    """Authenticated, a member of the acting organization; viewers may only read."""

    message = "You are not a member of an organization."

    def has_permission(self, request, view):
        if not request.user or not request.user.is_authenticated:
            return False
        membership = resolve_membership(request)
        if membership is None:
            return False
        request.organization = membership.organization
        request.membership = membership
        if request.method in permissions.SAFE_METHODS:
            return True
        if membership.role == Role.VIEWER:
            self.message = "Viewers can read but not change anything."
            return False
        return True


class IsOrganizationOwner(IsOrganizationMember):
    """Members may read; only owners change what decides access to the organization: its members, and
    which devices may join it (agent registration tokens) or stay in it (revoking an agent)."""

    owner_message = "Only an owner can change the organization's members."

    def has_permission(self, request, view):
        if not super().has_permission(request, view):
            return False
        if request.method in permissions.SAFE_METHODS or request.membership.role == Role.OWNER:
            return True
        self.message = self.owner_message
        return False


class IsOrganizationFleetOwner(IsOrganizationOwner):
    """Members may see the fleet; only owners enrol devices (registration tokens) and revoke agents."""

    owner_message = "Only an owner can create or revoke registration tokens and revoke agents."


class IsOrganizationMemberNotViewer(IsOrganizationMember):
    """Members and owners only, reads included: for secrets a viewer must not hold (the package key)."""

    def has_permission(self, request, view):
        if not super().has_permission(request, view):
            return False
        if request.membership.role != Role.VIEWER:
            return True
        self.message = "Viewers cannot read the organization's secrets (the package encryption key)."
        return False
