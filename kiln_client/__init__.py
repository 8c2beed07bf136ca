"""Kiln's Python client and command line (distribution kiln-client): `kiln_client.Client` for the REST API, the `kiln`
command (`cli`), and the deployment package verifier (`package_run`, also a package's own run.py). It needs no Django
and no runtime; it shares the HTTP base and resumable uploads with the agent through kiln_contract.

    import kiln_client
    client = kiln_client.Client("http://127.0.0.1:8000", token="kiln_pat_…")

Where the server is installed, `kiln.Client` (platform/kiln/__init__.py) is this same class.
"""
from kiln_client.client import ApiError, Client, ServerUnavailable

__all__ = ["ApiError", "Client", "ServerUnavailable"]
