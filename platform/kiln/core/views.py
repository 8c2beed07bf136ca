"""Health check and the single-page UI's index."""
from __future__ import annotations

from django.conf import settings
from django.db import connection
from django.http import HttpResponse, JsonResponse
from django.views.decorators.csrf import ensure_csrf_cookie


def health(request):
    """Liveness with a database round-trip, so a broken database shows up here."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok", "database": connection.vendor, "broker": settings.CELERY_BROKER_URL.split("://")[0]})


@ensure_csrf_cookie
def spa_index(request):
    index = settings.FRONTEND_DIST / "index.html"
    if not index.exists():
        return HttpResponse(
            "<h1>Kiln</h1><p>The web UI is not built. Run <code>make up</code> (or <code>frontend/build.sh</code>). "
            "The API is at <a href='/api/docs/'>/api/docs/</a>.</p>",
            status=200,
        )
    return HttpResponse(index.read_bytes(), content_type="text/html; charset=utf-8")

