"""Kiln. The Django project lives in this package; `kiln.Client` is the Python client of its REST API.

The client is imported lazily so that `import kiln` (and Django's start-up) never pulls it in, and
so that the client never needs Django: the kiln-client wheel (this module, client, cli, package_run) is enough for `kiln.Client(...)`.
"""


def __getattr__(name: str):
    if name in ("Client", "ApiError", "ServerUnavailable"):
        from kiln import client

        return getattr(client, name)
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")
