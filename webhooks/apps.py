"""App config for the delivery side: tenants, endpoints, events, deliveries."""
from django.apps import AppConfig
from django.db.models.signals import post_migrate


class WebhooksConfig(AppConfig):
    name = "webhooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from webhooks import sql

        # the PostgreSQL functions are source files (webhooks/sql/), installed after every migrate
        post_migrate.connect(sql.after_migrate, sender=self, dispatch_uid="webhooks.sql.after_migrate")
