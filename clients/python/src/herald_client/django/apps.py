"""The Django app of the outbox: `INSTALLED_APPS += ["herald_client.django"]`."""
from django.apps import AppConfig


class HeraldOutboxConfig(AppConfig):
    name = "herald_client.django"
    label = "herald_outbox"  # "django" would clash with Django's own apps' module names in messages
    verbose_name = "Herald outbox"
    default_auto_field = "django.db.models.BigAutoField"
