"""Database work from async code: run it on a shared executor thread and give the connection back."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections


def _close_after(function, kwargs):
    close_old_connections()
    try:
        return function(**kwargs)
    finally:
        connections.close_all()


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
