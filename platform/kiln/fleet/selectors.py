"""Reads for the fleet: agents, registration tokens, tokens presented by agents."""
from __future__ import annotations

from django.shortcuts import get_object_or_404

from kiln.core.tokens import digest_matches, split_token

from .models import Agent, RegistrationToken

REGISTRATION_TOKEN_PREFIX = "kiln_reg_"
AGENT_TOKEN_PREFIX = "kiln_agt_"


def _match(queryset, secret: str, prefix: str):
    lookup = split_token(secret, prefix)
    if lookup is None:
        return None
    for row in queryset.filter(lookup_prefix=lookup):
        if digest_matches(secret, row.digest):
            return row
    return None


def registration_token_from_secret(*, secret: str) -> RegistrationToken | None:
    token = _match(RegistrationToken.objects.select_related("organization"), secret, REGISTRATION_TOKEN_PREFIX)
    return token if token is not None and token.revoked_at is None else None


def agent_from_secret(*, secret: str) -> Agent | None:
    agent = _match(Agent.objects.select_related("organization"), secret, AGENT_TOKEN_PREFIX)
    return agent if agent is not None and agent.revoked_at is None else None


def agent_list(*, organization):
    return Agent.objects.filter(organization=organization)


def agent_get(*, organization, agent_id: int) -> Agent:
    return get_object_or_404(Agent, organization=organization, pk=agent_id)


def registration_token_list(*, organization):
    return RegistrationToken.objects.filter(organization=organization)


def registration_token_get(*, organization, token_id: int) -> RegistrationToken:
    return get_object_or_404(RegistrationToken, organization=organization, pk=token_id)


def agent_current_task_id(agent: Agent) -> int | None:
    from kiln.pipeline.models import DeviceTask, DeviceTaskStatus

    return DeviceTask.objects.filter(leased_by=agent, status=DeviceTaskStatus.LEASED).values_list("id", flat=True).first()
