"""The gunicorn worker class Kiln's web server runs: uvicorn's, without its proxy-header rewriting.

uvicorn replaces the client address with the last `X-Forwarded-For` entry whenever the peer is in
FORWARDED_ALLOW_IPS, which defaults to 127.0.0.1: any local client (or one behind a local proxy)
could then choose its own address, and with it a fresh sign-in throttle bucket per request. Kiln
decides the client address in one place (kiln.core.client_address, from KILN_TRUSTED_PROXIES), so
the server hands the application the socket's peer as it is. `make up`, the Dockerfile and
docker-compose all run this class.
"""
from __future__ import annotations

from uvicorn_worker import UvicornWorker as _UvicornWorker


class UvicornWorker(_UvicornWorker):
    CONFIG_KWARGS = {**_UvicornWorker.CONFIG_KWARGS, "proxy_headers": False}
