"""Revocations reach every server process at once: a generation in the shared cache that each one changes.

Server processes remember what a token stands for (kiln.core.token_cache), because a fleet of
agents and scripts present tokens all the time. Anything that can take access away (a token or an
agent revoked, a member's role changed or their membership ended, a user deactivated, any of these
rows deleted) announces a new generation once its transaction commits; every process compares the
generation of what it remembered with the current one on each use, so the next request anywhere
is checked against the database again. The generation is notify's: a Redis key with REDIS_URL
(every host), else a file under KILN_DATA_DIR (the embedded default's processes on one host).

The announcements come from model signals, so changes made through the services, the Django
admin or a shell all count; changes that only grant (a new token, a new agent) announce nothing,
so a fleet enrolling or a user making tokens never empties the caches.
"""
from __future__ import annotations

from django.apps import apps
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models.signals import post_delete, post_save

from kiln.core import notify

CHANNEL = "revocations"

# Fields whose change can take access away, per model ("app_label.Model"); None: any save of the row.
NARROWING_FIELDS = {
    "accounts.ApiToken": {"revoked_at", "expires_at", "user", "organization", "created_by_token"},
    "accounts.Membership": {"role", "user", "organization"},
    "fleet.Agent": {"revoked_at", "organization"},
}
USER_FIELDS = {"is_active"}


def revocation_generation() -> str | None:
    """The current generation (changes with every revocation); None when the shared cache cannot be read."""
    return notify.generation(CHANNEL)


def revocations_announce() -> None:
    """Announce a revocation once the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: notify.publish(CHANNEL))


def _narrows(fields: set[str], created: bool, update_fields) -> bool:
    if created:
        return False
    return update_fields is None or bool(fields & set(update_fields))


def _connect(model, fields: set[str]) -> None:
    def saved(sender, instance, created=False, update_fields=None, **kwargs):
        if _narrows(fields, created, update_fields):
            revocations_announce()

    def deleted(sender, instance, **kwargs):
        revocations_announce()

    uid = f"kiln.revocations.{model._meta.label}"
    post_save.connect(saved, sender=model, weak=False, dispatch_uid=f"{uid}.save")
    post_delete.connect(deleted, sender=model, weak=False, dispatch_uid=f"{uid}.delete")


def connect_signals() -> None:
    """Called once the apps are ready (kiln.core.apps)."""
    for label, fields in NARROWING_FIELDS.items():
        _connect(apps.get_model(label), fields)
    _connect(get_user_model(), USER_FIELDS)
