"""The documentation site at /docs/: the folder `make docs` builds from docs/ (MkDocs), served file by file.

Public, like /downloads/: it holds nothing an organization owns. Pages are served under the same strict
Content-Security-Policy as the UI; the theme's few inline scripts (colour scheme, local storage helpers) are allowed
by their sha256, computed from the served file itself, so nothing else inline can run.
"""
from __future__ import annotations

import base64
import hashlib
import re
from functools import lru_cache
from pathlib import Path

from django.conf import settings
from django.http import FileResponse, HttpResponse, HttpResponsePermanentRedirect
from django.views.decorators.http import require_safe
from whitenoise.media_types import MediaTypes

from .middleware import CONTENT_SECURITY_POLICY

INLINE_SCRIPT = re.compile(rb"<script>(.*?)</script>", re.DOTALL)
MEDIA_TYPES = MediaTypes()

NOT_BUILT = (
    "<!doctype html><title>Kiln documentation</title><h1>Kiln documentation</h1>"
    "<p>The documentation site is not built. Run <code>make docs</code> (or <code>make up</code>, which builds it) in the "
    "Kiln checkout; it is written to <code>site/</code> and served here. The same pages are readable as Markdown in the "
    "checkout's <code>docs/</code> folder. The API is at <a href='/api/docs/'>/api/docs/</a>.</p>"
)
NOT_FOUND = (
    "<!doctype html><title>Not found: Kiln documentation</title><h1>No such page</h1>"
    "<p>The documentation has no page at this address. Start at <a href='/docs/'>the documentation's home page</a>.</p>"
)


@require_safe
def docs_page(request, path: str = ""):
    """A file of the built site: a folder's index.html, an asset, or a page saying how to build the site."""
    root = Path(settings.DOCS_SITE).resolve()
    if not (root / "index.html").is_file():
        return HttpResponse(NOT_BUILT, content_type="text/html; charset=utf-8")
    target = site_file(root, path)
    if target is None:
        return HttpResponse(NOT_FOUND, status=404, content_type="text/html; charset=utf-8")
    if target.is_dir():
        if path and not path.endswith("/"):
            # Pages link to each other relatively, so a folder's address must end in "/".
            return HttpResponsePermanentRedirect(request.path + "/")
        target = target / "index.html"
        if not target.is_file():
            return HttpResponse(NOT_FOUND, status=404, content_type="text/html; charset=utf-8")
    if target.suffix == ".html":
        return html_response(target)
    response = FileResponse(target.open("rb"), content_type=MEDIA_TYPES.get_type(str(target)))
    response["Cache-Control"] = "public, max-age=3600"
    return response


def site_file(root: Path, path: str) -> Path | None:
    """The file or folder `path` names inside the site, or None: no hidden names, nothing outside it (symlinks included)."""
    parts = [part for part in path.split("/") if part]
    if any(part.startswith(".") or "\\" in part or "\x00" in part for part in parts):
        return None
    target = root.joinpath(*parts).resolve()
    if not target.is_relative_to(root) or not target.exists():
        return None
    return target


def html_response(page: Path) -> HttpResponse:
    stat = page.stat()
    body, policy = html_with_policy(str(page), stat.st_mtime_ns, stat.st_size)
    response = HttpResponse(body, content_type="text/html; charset=utf-8")
    response["Content-Security-Policy"] = policy
    response["Cache-Control"] = "no-cache"
    return response


@lru_cache(maxsize=256)
def html_with_policy(path: str, mtime_ns: int, size: int) -> tuple[bytes, str]:
    """A page's bytes and the UI's policy with the page's own inline scripts allowed by hash (cached per file version)."""
    body = Path(path).read_bytes()
    return body, content_security_policy(body)


def content_security_policy(html: bytes) -> str:
    hashes = sorted({"'sha256-" + base64.b64encode(hashlib.sha256(script).digest()).decode() + "'"
                     for script in INLINE_SCRIPT.findall(html)})
    if not hashes:
        return CONTENT_SECURITY_POLICY
    return CONTENT_SECURITY_POLICY.replace("script-src 'self'", "script-src 'self' " + " ".join(hashes), 1)
