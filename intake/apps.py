"""App config for the intake side: credentials, idempotency keys and the REST API."""
from django.apps import AppConfig


class IntakeConfig(AppConfig):
    name = "intake"
    default_auto_field = "django.db.models.BigAutoField"
