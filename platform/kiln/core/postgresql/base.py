"""Django's PostgreSQL backend with a pooled-connection health check that costs no round trip while the server is up."""
from __future__ import annotations

import select

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


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self):
        # Django builds the pool with ConnectionPool.check_connection (CONN_HEALTH_CHECKS) or no check,
        # and a `check` among OPTIONS["pool"] collides with its own argument; so this backend creates
        # the pool itself, with psycopg_pool's public `check=`, and Django's property then returns it.
        options = self.settings_dict["OPTIONS"].get("pool")
        if options and self.alias != NO_DB_ALIAS and self.alias not in self._connection_pools:
            self._connection_pools.setdefault(self.alias, self._checked_pool({} if options is True else options))
        return super().pool

    def _checked_pool(self, options: dict) -> ConnectionPool:
        """Django's pool (same connection arguments, configure hook, closed until first use) with `connection_check`."""
        if self.settings_dict.get("CONN_MAX_AGE", 0) != 0:
            raise ImproperlyConfigured("Pooling doesn't support persistent connections.")
        return ConnectionPool(
            kwargs={**self.get_connection_params(), "autocommit": True},  # Django sets autocommit itself later on
            open=False,
            configure=self._configure_connection,
            check=connection_check,
            **options,
        )
