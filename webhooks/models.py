"""Delivery-side records: tenants, endpoints and their secrets, events, deliveries and attempts."""
from django.contrib.postgres.fields import ArrayField
from django.db import models

from webhooks import ids


class Tenant(models.Model):
    """A customer of Herald; every endpoint, event and delivery belongs to exactly one."""

    id = models.CharField(primary_key=True, max_length=40, default=ids.tenant_id, editable=False)
    name = models.CharField(max_length=200, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Endpoint(models.Model):
    """An HTTP URL of a tenant that receives the events it subscribes to."""

    id = models.CharField(primary_key=True, max_length=40, default=ids.endpoint_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="endpoints")
    url = models.URLField(max_length=2000)
    description = models.CharField(max_length=500, blank=True, default="")
    event_types = ArrayField(models.CharField(max_length=200), default=list, blank=True)
    channels = ArrayField(models.CharField(max_length=128), default=list, blank=True)
    enabled = models.BooleanField(default=True)
    disabled_reason = models.CharField(max_length=200, blank=True, default="")
    failing_since = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["tenant", "enabled"], name="endpoint_tenant_enabled",
                         condition=models.Q(deleted_at__isnull=True)),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.url}"


class EndpointSecret(models.Model):
    """A signing secret; after rotation the old one keeps signing until `expires_at`."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="secrets")
    secret = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.secret[:10] + "…"


class Event(models.Model):
    """Something that happened in a tenant's system, recorded exactly once per intake request."""

    id = models.CharField(primary_key=True, max_length=40, default=ids.event_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="events")
    type = models.CharField(max_length=200)
    data = models.JSONField()
    channels = ArrayField(models.CharField(max_length=128), default=list, blank=True)
    # The exact webhook body, built once at intake so every attempt sends identical bytes.
    payload = models.BinaryField()
    # The intake request that recorded it, so delivery log lines join up with that request's.
    request_id = models.CharField(max_length=128, blank=True, default="")
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["tenant", "type", "-id"], name="event_tenant_type")]

    def __str__(self) -> str:
        return f"{self.id} {self.type}"


class Delivery(models.Model):
    """One event to one endpoint; its state machine lives in the database, not the broker."""

    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STATUSES = [(PENDING, "pending"), (SUCCEEDED, "succeeded"), (FAILED, "failed"), (CANCELLED, "cancelled")]

    id = models.CharField(primary_key=True, max_length=40, default=ids.delivery_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="deliveries")
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="deliveries")
    endpoint = models.ForeignKey(Endpoint, on_delete=models.PROTECT, related_name="deliveries")
    status = models.CharField(max_length=16, choices=STATUSES, default=PENDING)
    attempt_count = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # Lease: a worker that claims the delivery owns it until this time.
    locked_until = models.DateTimeField(null=True, blank=True)
    # When a task was last published for it; the dispatcher re-publishes only if that looks lost.
    enqueued_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "deliveries"
        constraints = [models.UniqueConstraint(fields=["event", "endpoint"], name="delivery_event_endpoint")]
        indexes = [
            models.Index(fields=["next_attempt_at"], name="delivery_due",
                         condition=models.Q(status="pending")),
            models.Index(fields=["-enqueued_at"], name="delivery_waiting",
                         condition=models.Q(status="pending", locked_until__isnull=True)),
            models.Index(fields=["tenant", "status", "-id"], name="delivery_tenant_status"),
            models.Index(fields=["endpoint", "-id"], name="delivery_endpoint"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.status}"


class DeliveryAttempt(models.Model):
    """One HTTP POST of a delivery, recorded truthfully whatever its outcome."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField()
    response_status = models.PositiveIntegerField(null=True, blank=True)
    response_body = models.TextField(blank=True, default="")
    error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["delivery", "number"]
        constraints = [models.UniqueConstraint(fields=["delivery", "number"], name="attempt_delivery_number")]

    def __str__(self) -> str:
        return f"attempt {self.number}"
