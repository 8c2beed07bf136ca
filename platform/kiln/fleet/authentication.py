"""Agent authentication: `Authorization: Bearer kiln_agt_…`, one token per agent."""
from __future__ import annotations

from rest_framework import authentication, exceptions, permissions

from kiln.core.tokens import bearer_secret

from .models import Agent
from .selectors import agent_from_secret


class AgentPrincipal:
    """Stands in for request.user on agent calls; the agent itself is request.auth."""

    is_authenticated = True
    is_anonymous = False

    def __init__(self, agent: Agent):
        self.agent = agent
        self.pk = None


class AgentTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request):
        secret = bearer_secret(request)
        if secret is None:
            return None
        agent = agent_from_secret(secret=secret)
        if agent is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked agent token; register the agent again.")
        return AgentPrincipal(agent), agent

    def authenticate_header(self, request):
        return 'Bearer realm="kiln-agent"'


class IsAgent(permissions.BasePermission):
    def has_permission(self, request, view):
        return isinstance(request.auth, Agent)
