"""URL map: REST API, agent protocol, OpenAPI, admin, the documentation site, and the single-page UI."""
from django.contrib import admin
from django.urls import include, path, re_path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from kiln.core.docs_site import docs_page
from kiln.core.downloads import download_wheel, downloads_index, downloads_json
from kiln.core.metrics_view import metrics
from kiln.core.views import health, spa_index

api_v1 = [
    path("health/", health, name="health"),
    path("downloads/", downloads_json, name="downloads-json"),
    path("", include("kiln.accounts.api.urls")),
    path("", include("kiln.registry.api.urls")),
    path("", include("kiln.pipeline.api.urls")),
    path("", include("kiln.reports.api.urls")),
    path("", include("kiln.fleet.api.urls")),
]

urlpatterns = [
    path("api/v1/", include(api_v1)),
    path("api/agent/v1/", include("kiln.fleet.api.agent_urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="docs"),
    path("admin/", admin.site.urls),
    path("metrics", metrics, name="metrics"),
    path("downloads/", downloads_index, name="downloads"),
    path("downloads/<str:name>", download_wheel, name="download-wheel"),
    path("docs", RedirectView.as_view(url="/docs/", permanent=True)),
    re_path(r"^docs/(?P<path>.*)$", docs_page, name="docs-site"),
    re_path(r"^(?!api/|admin/|static/|downloads/|docs/|metrics$).*$", spa_index, name="spa"),
]

handler400 = "kiln.core.views.bad_request"
handler403 = "kiln.core.views.permission_denied"
handler404 = "kiln.core.views.not_found"
handler500 = "kiln.core.views.server_error"
