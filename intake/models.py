"""Intake records: API credentials and the idempotency keys scoped to them."""
from django.db import models

from webhooks.models import Tenant


class ApiCredential(models.Model):
    """A bearer token; only its SHA-256 is stored, the token is shown once.

    Two kinds (SPEC §10): a tenant credential acts on its one tenant through the paths of §4; a platform
    credential has no tenant, manages tenants and acts for any of them under /api/v1/tenants/{tenant}/.
    """

    TENANT = "tenant"
    PLATFORM = "platform"
    KINDS = [(TENANT, "tenant"), (PLATFORM, "platform")]

    kind = models.CharField(max_length=16, choices=KINDS, default=TENANT)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="credentials", null=True, blank=True)
    name = models.CharField(max_length=200, blank=True, default="")
    token_prefix = models.CharField(max_length=16, help_text="First characters, to recognise a token.")
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.CheckConstraint(
            condition=models.Q(kind="tenant", tenant__isnull=False) | models.Q(kind="platform", tenant__isnull=True),
            name="credential_kind_tenant")]

    @property
    def is_platform(self) -> bool:
        return self.kind == self.PLATFORM

    @property
    def public_id(self) -> str:
        """The id the API shows (`cred_…`)."""
        return f"cred_{self.pk}"

    def __str__(self) -> str:
        owner = "platform" if self.is_platform else self.tenant.name
        return f"{owner}: {self.token_prefix}…"


class IdempotencyKey(models.Model):
    """One `Idempotency-Key` of one credential and the answer it got, written in the transaction of the
    request's work (intake/idempotency/): a row exists only once that request committed."""

    # No index of its own: the unique (credential, key) index leads with it (one index less per insert).
    credential = models.ForeignKey(ApiCredential, on_delete=models.CASCADE, related_name="idempotency_keys",
                                   db_index=False)
    # The tenant the platform acted for (/api/v1/tenants/{tenant}/…): the key is that tenant's too (SPEC §10),
    # erased with it, never met by a later tenant of the same uid. NULL on every other call (a tenant
    # credential's keys are its tenant's through the credential). Indexed where set (erasure finds them).
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", null=True, blank=True,
                               db_index=False)
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64)
    method = models.CharField(max_length=10)
    path = models.CharField(max_length=2000)
    response_status = models.PositiveSmallIntegerField()
    response_headers = models.JSONField()
    response_body = models.BinaryField()
    # The body is Fernet-encrypted (webhooks/crypto.py): the answer carried a secret (a portal link, a token).
    response_encrypted = models.BooleanField(default=False)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["-created_at"]
        # (credential, tenant, key), each half its own partial index: PostgreSQL 14 has no NULLS NOT DISTINCT.
        constraints = [
            models.UniqueConstraint(fields=["credential", "key"], condition=models.Q(tenant__isnull=True),
                                    name="idempotency_credential_key"),
            models.UniqueConstraint(fields=["credential", "tenant", "key"], condition=models.Q(tenant__isnull=False),
                                    name="idempotency_credential_tenant_key"),
        ]
        indexes = [models.Index(fields=["expires_at"], name="idempotency_expires_at"),
                   # the erasure of a tenant finds the platform's keys for it (the few that have one)
                   models.Index(fields=["tenant"], condition=models.Q(tenant__isnull=False),
                                name="idempotency_tenant")]

    def __str__(self) -> str:
        return f"{self.key} ({self.response_status})"
