"""Herald's URLs plus the intake floor, served by the same gunicorn."""
from django.urls import path

from bench.floor import FloorKeyView, PlainSenderView
from config.urls import urlpatterns as herald_urlpatterns

urlpatterns = [*herald_urlpatterns, path("floor/events", FloorKeyView.as_view()),
               path("floor/send", PlainSenderView.as_view())]
