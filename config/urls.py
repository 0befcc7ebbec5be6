"""Top-level URLs: the REST API under /api/v1/ and the admin."""
from django.contrib import admin
from django.urls import include, path

from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from config import ops

urlpatterns = [
    path("healthz", ops.healthz, name="healthz"),
    path("metrics", ops.metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("portal/", include("portal.urls")),
    path("api/v1/", include("intake.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
]

handler404 = "intake.problems.not_found"
handler500 = "intake.problems.server_error"
