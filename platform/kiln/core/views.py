"""Health check, the single-page UI's index, and error pages that answer JSON under /api/."""
from __future__ import annotations

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import connection
from django.http import HttpResponse, JsonResponse
from django.views import defaults
from django.views.csrf import csrf_failure as django_csrf_failure
from django.views.decorators.csrf import ensure_csrf_cookie

from .errors import json_error, upload_too_large
from .serializers import HealthSerializer, document


def health(request):
    """Liveness with a database round-trip, so a broken database shows up here."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok", "database": connection.vendor, "broker": settings.CELERY_BROKER_URL.split("://")[0]})


document(health, "get", HealthSerializer, "Liveness with a database round-trip; no sign-in.")


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



def _is_api(request) -> bool:
    return request.path.startswith("/api/")


def not_found(request, exception=None):
    if _is_api(request):
        return json_error("Not found.", "not_found", 404)
    return defaults.page_not_found(request, exception)


def bad_request(request, exception=None):
    if _is_api(request):
        if isinstance(exception, RequestDataTooBig):
            refusal = upload_too_large()
            return json_error(refusal.message, refusal.error_code, refusal.status_code)
        return json_error("Bad request.", "bad_request", 400)
    return defaults.bad_request(request, exception)


def permission_denied(request, exception=None):
    if _is_api(request):
        return json_error("You do not have permission to do this.", "permission_denied", 403)
    return defaults.permission_denied(request, exception)


def server_error(request):
    if _is_api(request):
        return json_error("Something went wrong on the server; the error has been logged.", "server_error", 500)
    return defaults.server_error(request)


def csrf_failure(request, reason=""):
    if _is_api(request):
        return json_error(f"CSRF check failed: {reason}", "csrf_failed", 403)
    return django_csrf_failure(request, reason)
