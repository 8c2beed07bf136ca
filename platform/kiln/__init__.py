"""Kiln. The Django project lives in this package; `kiln.Client` is the Python client of its REST API, kept for scripts
written against it where the server is installed: it is `kiln_client.Client` (kiln_client/, the kiln-client wheel).

The client is imported lazily so that `import kiln` (and Django's start-up) never pulls it in.
"""


def __getattr__(name: str):
    if name in ("Client", "ApiError", "ServerUnavailable"):
        import kiln_client

        return getattr(kiln_client, name)
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")
