"""Django's PostgreSQL backend with a pooled-connection health check that costs no round trip while the server is up."""
from __future__ import annotations

import select

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
        pool = super().pool
        # Django gives the pool either ConnectionPool.check_connection (CONN_HEALTH_CHECKS) or no
        # check, and refuses a `check` among the pool options; psycopg_pool reads `_check` on each checkout.
        if pool is not None and pool._check is not connection_check:
            pool._check = connection_check
        return pool
