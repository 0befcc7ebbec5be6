"""URLs of the REST API, mounted at /api/v1/.

The tenant calls of SPEC §4 are mounted twice, the same views both times: at the root for a tenant
credential, and under `tenants/{tenant}/` (namespace `acting`) for a platform credential acting for
that tenant (SPEC §10); intake/views.py's TenantAPIView decides the tenant.
"""
from django.urls import include, path

from intake import views

tenant_urlpatterns = [
    path("endpoints", views.EndpointListCreateView.as_view(), name="endpoint-list"),
    path("endpoints/<str:endpoint_id>", views.EndpointDetailView.as_view(), name="endpoint-detail"),
    path("endpoints/<str:endpoint_id>/secret", views.EndpointSecretView.as_view(), name="endpoint-secret"),
    path("endpoints/<str:endpoint_id>/rotate-secret", views.EndpointRotateSecretView.as_view(),
         name="endpoint-rotate-secret"),
    path("endpoints/<str:endpoint_id>/test", views.EndpointTestView.as_view(), name="endpoint-test"),
    path("endpoints/<str:endpoint_id>/messages", views.EndpointMessagesView.as_view(), name="endpoint-messages"),
    path("endpoints/<str:endpoint_id>/recover", views.EndpointRecoverView.as_view(), name="endpoint-recover"),
    path("recoveries/<str:recovery_id>", views.RecoveryDetailView.as_view(), name="recovery-detail"),
    path("portal-links", views.PortalLinkView.as_view(), name="portal-links"),
    path("events", views.EventListCreateView.as_view(), name="event-list"),
    path("events/batch", views.EventBatchCreateView.as_view(), name="event-batch"),
    path("events/<str:event_id>", views.EventDetailView.as_view(), name="event-detail"),
    path("deliveries", views.DeliveryListView.as_view(), name="delivery-list"),
    path("deliveries/<str:delivery_id>", views.DeliveryDetailView.as_view(), name="delivery-detail"),
    path("deliveries/<str:delivery_id>/retry", views.DeliveryRetryView.as_view(), name="delivery-retry"),
]

# The deployment's own (SPEC §12): one catalog for every tenant, not mounted under tenants/{tenant}/.
deployment_urlpatterns = [
    path("event-types", views.EventTypeListCreateView.as_view(), name="event-type-list"),
    path("event-types/<str:name>", views.EventTypeDetailView.as_view(), name="event-type-detail"),
]

platform_urlpatterns = [
    path("tenants", views.TenantListCreateView.as_view(), name="tenant-list"),
    path("tenants/<str:tenant>", views.TenantDetailView.as_view(), name="tenant-detail"),
    path("tenants/<str:tenant>/credentials", views.TenantCredentialCreateView.as_view(), name="tenant-credentials"),
    path("tenants/<str:tenant>/credentials/<str:credential_id>", views.TenantCredentialDetailView.as_view(),
         name="tenant-credential"),
    path("tenants/<str:tenant>/", include((tenant_urlpatterns, "acting"))),
]

urlpatterns = tenant_urlpatterns + deployment_urlpatterns + platform_urlpatterns
