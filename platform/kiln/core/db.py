"""Database work from async code: run it on a shared executor thread and give the connection back."""
from __future__ import annotations

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections


def _close_after(function, kwargs):
    close_old_connections()
    try:
        return function(**kwargs)
    finally:
        connections.close_all()


async def run_in_db_thread(function, **kwargs):
    """Run a database function off the event loop, then give its connection back.

    Shared executor threads (thread_sensitive=False) serve every waiting request, so a long-poll
    or an event stream holds neither a thread nor a database connection while it sleeps.
    """
    return await sync_to_async(_close_after, thread_sensitive=False)(function, kwargs)
