"""Database work from async code: run it on a shared executor thread and give the connection back."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async
from django.db import connections


def _close_after(function, kwargs):
    _drop_connections(keep_sqlite=True, only_obsolete=True)
    try:
        return function(**kwargs)
    finally:
        _drop_connections(keep_sqlite=True, only_obsolete=False)


def _drop_connections(*, keep_sqlite: bool, only_obsolete: bool) -> None:
    """Give this thread's connections back (to the pool, or closed), except an SQLite one.

    An SQLite connection is a file handle, with no server and no pool behind it, and opening one
    (pragmas, Django's SQL functions) costs more CPU than an agent's queries: the executor's few,
    long-lived threads keep theirs.
    """
    for connection in connections.all(initialized_only=True):
        if keep_sqlite and connection.vendor == "sqlite" and not connection.in_atomic_block:
            continue
        if only_obsolete:
            connection.close_if_unusable_or_obsolete()
        else:
            connection.close()


# Heartbeats get threads of their own: in a busy fleet they would otherwise queue behind the lease
# checks in the shared executor, long enough for a live agent to be marked offline.
_HEARTBEAT_THREADS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kiln-heartbeat-db")


async def run_in_db_thread(function, *, heartbeat: bool = False, **kwargs):
    """Run a database function off the event loop, then give its connection back.

    Shared executor threads (thread_sensitive=False) serve every waiting request, so a long-poll
    or an event stream holds neither a thread nor a database connection while it sleeps.
    `heartbeat` runs it on the heartbeats' own threads.
    """
    executor = _HEARTBEAT_THREADS if heartbeat else None
    return await sync_to_async(_close_after, thread_sensitive=False, executor=executor)(function, kwargs)
