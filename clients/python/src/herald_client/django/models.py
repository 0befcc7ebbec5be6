"""The outbox table, in the platform's own database: one row per `publish()`, sent by `herald_relay`."""
from __future__ import annotations

import uuid

from django.db import models


class OutboxMessage(models.Model):
    """One event to send to Herald. `key` makes the Idempotency-Key of a single POST of this row; `batch`,
    once set, names the batch the row is sent in and never changes (its key is made from it), so a relay
    that dies mid-batch leaves the next one the very same batch to send under the very same key."""

    PENDING, SENT, FAILED = "pending", "sent", "failed"
    STATUSES = [(PENDING, "pending"), (SENT, "sent"), (FAILED, "failed")]

    id = models.BigAutoField(primary_key=True)
    key = models.UUIDField(default=uuid.uuid4, editable=False)
    tenant = models.CharField(max_length=128, blank=True, default="",
                              help_text="The tenant's id or uid (a platform token); empty: the token's own tenant.")
    type = models.CharField(max_length=200)
    data = models.JSONField()
    channels = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    status = models.CharField(max_length=8, choices=STATUSES, default=PENDING)
    batch = models.UUIDField(null=True, blank=True, editable=False)
    single = models.BooleanField(default=False, help_text="Sent alone (its batch was refused as a whole).")
    sent_at = models.DateTimeField(null=True, blank=True)
    event_id = models.CharField(max_length=40, blank=True, default="", help_text="Herald's event (evt_…).")
    error = models.JSONField(null=True, blank=True, help_text="Herald's problem, when it refused the row for good.")

    class Meta:
        db_table = "herald_outbox_message"
        ordering = ["id"]
        indexes = [
            models.Index(fields=["status", "id"], name="herald_outbox_status_id"),
            models.Index(fields=["batch"], name="herald_outbox_batch"),
        ]

    def __str__(self) -> str:
        return f"{self.type} #{self.id} ({self.status})"
