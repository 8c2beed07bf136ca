"""Sign-in, sign-up, organization choice and API tokens."""
from __future__ import annotations

from django.conf import settings
from django.contrib.auth import authenticate, login, logout
from django.middleware.csrf import get_token
from django.shortcuts import get_object_or_404
from django.utils.decorators import method_decorator
from django.views.decorators.csrf import ensure_csrf_cookie
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from kiln.core.errors import KilnError

from .. import services
from ..authentication import CsrfSessionAuthentication
from ..models import ApiToken
from ..permissions import SESSION_ORGANIZATION_KEY, IsOrganizationOwner, resolve_membership
from ..selectors import api_tokens_of, members_of, membership_get, membership_in, memberships_of
from .serializers import (
    ApiTokenCreatedSerializer,
    ApiTokenCreateSerializer,
    ApiTokenSerializer,
    CsrfSerializer,
    LoginSerializer,
    MembershipCreateSerializer,
    MembershipRoleSerializer,
    MembershipSerializer,
    MeSerializer,
    OrganizationChoiceSerializer,
    SignupSerializer,
)


def _organization_json(membership) -> dict:
    org = membership.organization
    return {"id": org.id, "name": org.name, "slug": org.slug, "role": membership.role}


def me_json(request) -> dict:
    membership = resolve_membership(request)
    return {
        "user": {"id": request.user.id, "username": request.user.username},
        "organization": _organization_json(membership) if membership else None,
        "organizations": [_organization_json(m) for m in memberships_of(user=request.user)],
    }


@method_decorator(ensure_csrf_cookie, name="dispatch")
class CsrfView(APIView):
    permission_classes = [AllowAny]
    authentication_classes = []

    @extend_schema(responses={200: CsrfSerializer})
    def get(self, request):
        return Response({"csrf_token": get_token(request)})


class CredentialsThrottled:
    """Calls that check a password or a secret: limited per client address."""

    throttle_classes = [ScopedRateThrottle]
    throttle_scope = "credentials"


class CsrfRequired:
    """CSRF even before a session exists: otherwise a form on another site can sign a browser
    into the attacker's account (login CSRF). DRF checks CSRF only for signed-in users."""

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        CsrfSessionAuthentication().enforce_csrf(request._request)


class LoginView(CsrfRequired, CredentialsThrottled, APIView):
    permission_classes = [AllowAny]

    @extend_schema(request=LoginSerializer, responses={200: MeSerializer})
    def post(self, request):
        data = LoginSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        user = authenticate(request, username=data.validated_data["username"], password=data.validated_data["password"])
        if user is None:
            raise KilnError("Wrong username or password.", code="invalid_credentials")
        login(request, user)
        return Response(me_json(request))


class LogoutView(APIView):
    permission_classes = [AllowAny]

    @extend_schema(request=None, responses={204: None})
    def post(self, request):
        logout(request)
        return Response(status=status.HTTP_204_NO_CONTENT)


class SignupView(CsrfRequired, CredentialsThrottled, APIView):
    permission_classes = [AllowAny]

    @extend_schema(request=SignupSerializer, responses={201: MeSerializer})
    def post(self, request):
        if not settings.ALLOW_SIGNUP:
            raise KilnError("Sign-up is disabled on this server; ask an administrator.", code="signup_disabled", status_code=403)
        data = SignupSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        user = services.user_signup(
            username=data.validated_data["username"],
            password=data.validated_data["password"],
            organization_name=data.validated_data["organization"],
        )
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        return Response(me_json(request), status=status.HTTP_201_CREATED)


class MeView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(responses={200: MeSerializer})
    def get(self, request):
        return Response(me_json(request))


class OrganizationSwitchView(APIView):
    permission_classes = [IsAuthenticated]

    @extend_schema(request=OrganizationChoiceSerializer, responses={200: MeSerializer})
    def post(self, request):
        data = OrganizationChoiceSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        if isinstance(request.auth, ApiToken):
            raise KilnError("An API token is bound to one organization.", code="token_bound")
        if membership_get(user=request.user, organization_id=data.validated_data["organization"]) is None:
            raise KilnError("Not found.", code="not_found", status_code=404)
        request.session[SESSION_ORGANIZATION_KEY] = data.validated_data["organization"]
        return Response(me_json(request))


class ApiTokenListView(APIView):
    @extend_schema(responses={200: ApiTokenSerializer(many=True)})
    def get(self, request):
        tokens = api_tokens_of(user=request.user, organization=request.organization)
        return Response(ApiTokenSerializer(tokens, many=True).data)

    @extend_schema(request=ApiTokenCreateSerializer, responses={201: ApiTokenCreatedSerializer})
    def post(self, request):
        data = ApiTokenCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        token, secret = services.api_token_create(
            user=request.user,
            organization=request.organization,
            name=data.validated_data["name"],
            expires_in_days=data.validated_data.get("expires_in_days"),
            created_by_token=request.auth if isinstance(request.auth, ApiToken) else None,
        )
        return Response({**ApiTokenSerializer(token).data, "token": secret}, status=status.HTTP_201_CREATED)


class ApiTokenRevokeView(APIView):
    @extend_schema(request=None, responses={200: ApiTokenSerializer})
    def post(self, request, pk: int):
        token = get_object_or_404(ApiToken, pk=pk, user=request.user, organization=request.organization)
        return Response(ApiTokenSerializer(services.api_token_revoke(token=token)).data)


class MemberListView(APIView):
    permission_classes = [IsOrganizationOwner]

    @extend_schema(responses={200: MembershipSerializer(many=True)})
    def get(self, request):
        return Response(MembershipSerializer(members_of(organization=request.organization), many=True).data)

    @extend_schema(request=MembershipCreateSerializer, responses={201: MembershipSerializer})
    def post(self, request):
        data = MembershipCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        membership = services.membership_add(organization=request.organization, **data.validated_data)
        return Response(MembershipSerializer(membership).data, status=status.HTTP_201_CREATED)


class MemberDetailView(APIView):
    permission_classes = [IsOrganizationOwner]

    @extend_schema(request=MembershipRoleSerializer, responses={200: MembershipSerializer})
    def patch(self, request, pk: int):
        membership = membership_in(organization=request.organization, membership_id=pk)
        data = MembershipRoleSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return Response(MembershipSerializer(services.membership_change_role(membership=membership, role=data.validated_data["role"])).data)

    @extend_schema(responses={204: None})
    def delete(self, request, pk: int):
        services.membership_remove(membership=membership_in(organization=request.organization, membership_id=pk))
        return Response(status=status.HTTP_204_NO_CONTENT)
