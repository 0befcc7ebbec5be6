"""The tenant portal, mounted at /portal/."""
from django.urls import path

from portal import views

app_name = "portal"
urlpatterns = [
    path("open/<str:token>", views.open_link, name="open"),
    path("logout", views.logout, name="logout"),
    path("", views.endpoints, name="endpoints"),
    path("endpoints/new", views.endpoint_new, name="endpoint-new"),
    path("endpoints/<str:endpoint_id>", views.endpoint_detail, name="endpoint"),
    path("endpoints/<str:endpoint_id>/secret", views.endpoint_secret, name="endpoint-secret"),
    path("endpoints/<str:endpoint_id>/rotate", views.endpoint_rotate, name="endpoint-rotate"),
    path("endpoints/<str:endpoint_id>/test", views.endpoint_test, name="endpoint-test"),
    path("endpoints/<str:endpoint_id>/recover", views.endpoint_recover, name="endpoint-recover"),
    path("recoveries/<str:recovery_id>", views.recovery_detail, name="recovery"),
    path("endpoints/<str:endpoint_id>/access", views.endpoint_access, name="endpoint-access"),
    path("deliveries", views.deliveries, name="deliveries"),
    path("deliveries/<str:delivery_id>", views.delivery_detail, name="delivery"),
    path("deliveries/<str:delivery_id>/resend", views.delivery_resend, name="delivery-resend"),
    path("event-types", views.event_types, name="event-types"),
    path("events", views.events, name="events"),
    path("events/<str:event_id>", views.event_detail, name="event"),
]
