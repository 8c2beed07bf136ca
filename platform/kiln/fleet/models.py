"""Device agents and the registration tokens that enrol them."""
from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

from kiln.accounts.models import Organization


class RegistrationToken(models.Model):
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="registration_tokens")
    name = models.CharField(max_length=120)
    lookup_prefix = models.CharField(max_length=16, db_index=True)
    digest = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # None: the token works until revoked. Past it, the token enrols nothing (fleet.services.agent_register).
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    @property
    def expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()


class Agent(models.Model):
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="agents")
    name = models.CharField(max_length=120)
    labels = models.JSONField(default=dict)
    capabilities = models.JSONField(default=dict)
    lookup_prefix = models.CharField(max_length=16, db_index=True)
    digest = models.CharField(max_length=64, unique=True)
    registration_token = models.ForeignKey(RegistrationToken, null=True, on_delete=models.SET_NULL, related_name="agents")
    created_at = models.DateTimeField(auto_now_add=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # Set by the housekeeping beat when heartbeats stop; cleared by the next heartbeat.
    offline_since = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name", "id"]

    @property
    def online(self) -> bool:
        if self.revoked_at is not None or self.last_heartbeat_at is None:
            return False
        return timezone.now() - self.last_heartbeat_at < timedelta(seconds=settings.AGENT_OFFLINE_AFTER_SECONDS)

    @property
    def backends(self) -> set[str]:
        return set((self.capabilities or {}).get("runtimes", {}) or {})
