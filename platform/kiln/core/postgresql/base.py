"""Django's PostgreSQL backend with a pooled-connection health check that costs no round trip while the server is up."""
from __future__ import annotations

import select
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool


def connection_check(connection) -> None:
    """Raise if a pooled connection is dead; run by the pool on every checkout.

    An idle connection has nothing to read: a server that shuts down or restarts sends its
    "terminating connection" error, or closes the socket, and either makes the socket readable.
    Only then is a real round trip (`SELECT 1`) spent; a healthy, quiet connection costs a poll(),
    not one round trip per request as ConnectionPool.check_connection does.
    """
    if connection.closed or connection.broken:
        raise ConnectionError("the pooled connection is closed")
    readable, _, _ = select.select([connection.fileno()], [], [], 0)
    if readable:
        ConnectionPool.check_connection(connection)


def django_pool_internals(wrapper: base.DatabaseWrapper) -> tuple[dict[str, ConnectionPool], Callable[[Any], bool]]:
    """Django's registry of pools by alias and its hook that sets up a new connection (time zone, role).

    Private Django API (5.1+), used here and nowhere else: no public setting gives Django's pool another
    `check` (CONN_HEALTH_CHECKS picks ConnectionPool.check_connection or none; a `check` in OPTIONS["pool"]
    collides with Django's own argument). Django's `pool` property returns `_connection_pools[alias]` when
    it is there and builds its pool with `configure=_configure_connection`; this backend puts its own pool
    there first. tests/platform/test_postgresql_pool.py fails if Django moves or renames either.
    """
    return wrapper._connection_pools, wrapper._configure_connection


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self):
        # Django builds the pool with ConnectionPool.check_connection (CONN_HEALTH_CHECKS) or no check, so
        # this backend creates the pool itself, with psycopg_pool's public `check=`, and Django's property
        # then returns it.
        options = self.settings_dict["OPTIONS"].get("pool")
        pools, configure = django_pool_internals(self)
        if options and self.alias != NO_DB_ALIAS and self.alias not in pools:
            pools.setdefault(self.alias, self._checked_pool({} if options is True else options, configure))
        return super().pool

    def _checked_pool(self, options: dict, configure: Callable[[Any], bool]) -> ConnectionPool:
        """Django's pool (same connection arguments, configure hook, closed until first use) with `connection_check`."""
        if self.settings_dict.get("CONN_MAX_AGE", 0) != 0:
            raise ImproperlyConfigured("Pooling doesn't support persistent connections.")
        return ConnectionPool(
            kwargs={**self.get_connection_params(), "autocommit": True},  # Django sets autocommit itself later on
            open=False,
            configure=configure,
            check=connection_check,
            **options,
        )
