"""kiln.core.postgresql: the pool's health check polls the socket, and a connection the server killed is replaced."""
from __future__ import annotations

import select

import psycopg
import pytest
from django.db import connection

from kiln.core.postgresql.base import DatabaseWrapper, connection_check, django_pool_internals

pytestmark = pytest.mark.django_db(transaction=True)


class CountingConnection(psycopg.Connection):
    """A connection that counts the statements sent on it."""

    statements = 0

    def execute(self, *args, **kwargs):
        self.statements += 1
        return super().execute(*args, **kwargs)


def _terminate(pid: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])


def test_a_quiet_healthy_connection_passes_without_a_round_trip_and_a_killed_one_fails():
    conn = CountingConnection.connect(**{**connection.get_connection_params(), "autocommit": True})
    try:
        connection_check(conn)
        assert conn.statements == 0
        _terminate(conn.info.backend_pid)
        # The server's goodbye makes the socket readable; only then does the check spend a round trip, which fails.
        select.select([conn.fileno()], [], [], 10)
        with pytest.raises(psycopg.OperationalError):
            connection_check(conn)
    finally:
        conn.close()


def test_the_backend_pool_replaces_a_connection_the_server_killed_instead_of_handing_it_out():
    settings = {**connection.settings_dict, "CONN_MAX_AGE": 0, "OPTIONS": {"pool": {"min_size": 1, "max_size": 1, "timeout": 10}}}
    wrapper = DatabaseWrapper(settings, alias="pool-test")
    pool = wrapper.pool
    pool.open(wait=True)
    try:
        with pool.connection() as conn:
            killed = conn.info.backend_pid
        with pool.connection() as conn:
            assert conn.info.backend_pid == killed  # a healthy connection is reused, not replaced
            idle = conn
        _terminate(killed)
        # pg_terminate_backend returns before the backend's goodbye reaches the socket; a connection idle in the pool
        # has long had it by its next checkout. Without this wait a loaded machine hands out the connection first.
        select.select([idle.fileno()], [], [], 10)
        with pool.connection() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            assert conn.info.backend_pid != killed
    finally:
        wrapper.close_pool()


def test_the_django_internals_this_backend_relies_on_are_still_there():
    """If Django renames `_connection_pools` or `_configure_connection`, or stops returning the registered pool, this fails
    (not a pool that silently lost its health check or Django's connection setup)."""
    settings = {**connection.settings_dict, "CONN_MAX_AGE": 0, "TIME_ZONE": "Asia/Tokyo",
                "OPTIONS": {"pool": {"min_size": 1, "max_size": 1, "timeout": 10}}}
    wrapper = DatabaseWrapper(settings, alias="pool-internals-test")
    pools, configure = django_pool_internals(wrapper)
    assert isinstance(pools, dict) and callable(configure)
    pool = wrapper.pool
    assert pools["pool-internals-test"] is pool  # Django's property returns the pool this backend registered
    pool.open(wait=True)
    try:
        with pool.connection() as conn:
            # Django's configure hook ran on the pooled connection: it set the wrapper's time zone.
            assert conn.execute("SHOW TimeZone").fetchone() == ("Asia/Tokyo",)
    finally:
        wrapper.close_pool()
    assert "pool-internals-test" not in pools  # Django's close_pool() removes it from the same registry
