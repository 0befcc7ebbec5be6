"""App config for the intake side: credentials, idempotency keys and the REST API."""
from django.apps import AppConfig


class IntakeConfig(AppConfig):
    name = "intake"
    default_auto_field = "django.db.models.BigAutoField"

    def reencrypt_secrets(self, *, batch_size: int) -> tuple[int, str]:
        """`manage.py reencrypt_secrets`' share of this app: the stored answers that carry a secret."""
        from intake.idempotency.store import keys_reencrypt

        return keys_reencrypt(batch_size=batch_size), "stored idempotent answers"
