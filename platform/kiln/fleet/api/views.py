"""User-facing fleet API: agents and registration tokens."""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.response import Response
from rest_framework.views import APIView

from kiln.accounts.permissions import IsOrganizationFleetOwner

from .. import selectors, services, setup
from .serializers import (
    AgentSerializer,
    AgentSetupSerializer,
    RegistrationTokenCreatedSerializer,
    RegistrationTokenCreateSerializer,
    RegistrationTokenSerializer,
)


class AgentListView(generics.ListAPIView):
    serializer_class = AgentSerializer
    pagination_class = None

    def get_queryset(self):
        return selectors.agent_list(organization=self.request.organization)


class AgentSetupView(APIView):
    """The server's address as devices reach it (with a warning when it is loopback) and the agent's install command."""

    @extend_schema(responses={200: AgentSetupSerializer})
    def get(self, request):
        return Response(setup.agent_setup(request))


class AgentDetailView(APIView):
    @extend_schema(responses={200: AgentSerializer})
    def get(self, request, pk: int):
        return Response(AgentSerializer(selectors.agent_get(organization=request.organization, agent_id=pk)).data)


class AgentRevokeView(APIView):
    permission_classes = [IsOrganizationFleetOwner]

    @extend_schema(request=None, responses={200: AgentSerializer})
    def post(self, request, pk: int):
        agent = services.agent_revoke(agent=selectors.agent_get(organization=request.organization, agent_id=pk))
        return Response(AgentSerializer(agent).data)


class RegistrationTokenListView(APIView):
    permission_classes = [IsOrganizationFleetOwner]

    @extend_schema(responses={200: RegistrationTokenSerializer(many=True)})
    def get(self, request):
        tokens = selectors.registration_token_list(organization=request.organization)
        return Response(RegistrationTokenSerializer(tokens, many=True).data)

    @extend_schema(request=RegistrationTokenCreateSerializer, responses={201: RegistrationTokenCreatedSerializer})
    def post(self, request):
        data = RegistrationTokenCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        token, secret = services.registration_token_create(organization=request.organization, user=request.user, name=data.validated_data["name"],
                                                           expires_at=data.validated_data.get("expires_at"))
        body = {**RegistrationTokenSerializer(token).data, "token": secret, "register_command": setup.register_command(setup.server_url(request)[0], secret)}
        return Response(body, status=status.HTTP_201_CREATED)


class RegistrationTokenRevokeView(APIView):
    permission_classes = [IsOrganizationFleetOwner]

    @extend_schema(request=None, responses={200: RegistrationTokenSerializer})
    def post(self, request, pk: int):
        token = services.registration_token_revoke(token=selectors.registration_token_get(organization=request.organization, token_id=pk))
        return Response(RegistrationTokenSerializer(token).data)
