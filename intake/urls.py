"""URLs of the REST API, mounted at /api/v1/."""
from django.urls import path

from intake import views

urlpatterns = [
    path("endpoints", views.EndpointListCreateView.as_view(), name="endpoint-list"),
    path("endpoints/<str:endpoint_id>", views.EndpointDetailView.as_view(), name="endpoint-detail"),
    path("endpoints/<str:endpoint_id>/secret", views.EndpointSecretView.as_view(), name="endpoint-secret"),
    path("endpoints/<str:endpoint_id>/rotate-secret", views.EndpointRotateSecretView.as_view(),
         name="endpoint-rotate-secret"),
    path("endpoints/<str:endpoint_id>/test", views.EndpointTestView.as_view(), name="endpoint-test"),
    path("endpoints/<str:endpoint_id>/recover", views.EndpointRecoverView.as_view(), name="endpoint-recover"),
    path("recoveries/<str:recovery_id>", views.RecoveryDetailView.as_view(), name="recovery-detail"),
    path("portal-links", views.PortalLinkView.as_view(), name="portal-links"),
    path("events", views.EventListCreateView.as_view(), name="event-list"),
    path("events/<str:event_id>", views.EventDetailView.as_view(), name="event-detail"),
    path("deliveries", views.DeliveryListView.as_view(), name="delivery-list"),
    path("deliveries/<str:delivery_id>", views.DeliveryDetailView.as_view(), name="delivery-detail"),
    path("deliveries/<str:delivery_id>/retry", views.DeliveryRetryView.as_view(), name="delivery-retry"),
]
