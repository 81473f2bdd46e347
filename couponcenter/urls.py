"""The project's URLs: every app's API under ``/api/``, the admin and its operations console, the
schema and docs, health and metrics."""

from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from couponcenter.core import health, site
from couponcenter.core.api.errors import bad_request, not_found, server_error
from couponcenter.ops.views import console_urls

urlpatterns = [
    path("", site.home, name="home"),
    path("favicon.ico", site.favicon, name="favicon"),
    path("admin/console/", include(console_urls())),  # the operations console
    path("admin/", admin.site.urls),
    path("api/", include("couponcenter.coupons.api.urls")),
    path("api/", include("reminders.api.urls")),
    path("api/", include("couponcenter.ops.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    path("healthz/", health.ready, name="healthz"),
    path("healthz/live/", health.live, name="healthz-live"),
    path("metrics", health.metrics, name="metrics"),
    # Last: whatever else is under /api/ (an unknown path, an id that is not one) is a JSON 404.
    re_path(r"^api/", not_found, name="api-not-found"),
]

handler400 = bad_request
handler404 = not_found
handler500 = server_error
