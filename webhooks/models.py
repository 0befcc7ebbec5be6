"""Delivery-side records: tenants, endpoints and their secrets, events, deliveries and attempts."""
import json
from typing import Any

from django.contrib.postgres.fields import ArrayField
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from webhooks import crypto, ids
from webhooks.urltext import url_without_secrets


class Tenant(models.Model):
    """A customer of Herald (or of the platform in front of it, SPEC §10); every endpoint, event and
    delivery belongs to exactly one.

    A deleted tenant (`deleted_at` set) is gone for the API at once and is erased by beat in batches
    (intake/tenants.py); until then its row holds its place for the foreign keys of what it still owns.
    """

    id = models.CharField(primary_key=True, max_length=40, default=ids.tenant_id, editable=False)
    name = models.CharField(max_length=200)
    # The platform's own id for its customer (SPEC §10): unique among live tenants, so that a deleted
    # customer's uid can be given to a new tenant at once.
    uid = models.CharField(max_length=128, null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    # Endpoints it may have (null: TENANT_MAX_ENDPOINTS).
    max_endpoints = models.PositiveIntegerField(null=True, blank=True)
    # Its share of the delivery workers while other tenants have deliveries waiting too (SPEC §10, 1-100):
    # the relays publish its outbox rows in proportion (webhooks/delivery/scheduling.py).
    delivery_weight = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1), MaxValueValidator(100)])
    created_at = models.DateTimeField(auto_now_add=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["uid"], condition=models.Q(deleted_at__isnull=True),
                                               name="tenant_live_uid"),
                       models.CheckConstraint(condition=models.Q(delivery_weight__gte=1, delivery_weight__lte=100),
                                              name="tenant_delivery_weight")]
        indexes = [
            # beat's erasure: the deleted tenants still to erase
            models.Index(fields=["deleted_at"], name="tenant_deleted", condition=models.Q(deleted_at__isnull=False)),
        ]

    def __str__(self) -> str:
        return self.name if self.uid is None else f"{self.name} ({self.uid})"


class EventType(models.Model):
    """An entry of the deployment's event-type catalog (SPEC §12): what a type means, and optionally the
    JSON Schema (draft 2020-12) its `data` must match at intake. Types outside the catalog are accepted.

    `schema_digest` is the SHA-256 of the canonical schema (None without one): intake reads it in its own
    query and recompiles its cached validator only when the digest it holds differs, so a change reaches
    every process at its next event of that type (webhooks/event_schemas.py).
    """

    id = models.CharField(primary_key=True, max_length=40, default=ids.event_type_id, editable=False)
    name = models.CharField(max_length=200, unique=True)
    description = models.TextField(max_length=2000, blank=True, default="")
    schema = models.JSONField(null=True, blank=True)
    schema_digest = models.CharField(max_length=64, null=True, blank=True, editable=False)
    example = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class JsonPathField(models.TextField):
    """A PostgreSQL `jsonpath` column: parsed once when written, evaluated as it is by `@@`."""

    def db_type(self, connection) -> str:
        return "jsonpath"


class Endpoint(models.Model):
    """Where a tenant receives the events it subscribes to: an HTTP URL, a polling endpoint (`kind` poll, no
    URL) whose consumer reads its messages (webhooks/services/polling.py), or a message broker of the tenant's
    (SPEC §14; its URL with credentials and its fields are its EndpointAccess row's). Each kind is a module of
    webhooks/delivery/destinations/."""

    HTTP = "http"
    POLL = "poll"
    AMQP = "amqp"
    REDIS_STREAM = "redis_stream"
    NATS = "nats"
    KINDS = [(HTTP, "http: Herald POSTs each message to its URL"), (POLL, "poll: its consumer reads its messages"),
             (AMQP, "amqp: published to an exchange of the tenant's RabbitMQ"),
             (REDIS_STREAM, "redis_stream: added to a stream of the tenant's Redis"),
             (NATS, "nats: published to the tenant's NATS JetStream")]

    id = models.CharField(primary_key=True, max_length=40, default=ids.endpoint_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="endpoints")
    # Set once, at creation. A poll endpoint's deliveries are never claimed for HTTP: intake gives them
    # no outbox row and no next_attempt_at, which the claim requires (migration 0009).
    kind = models.CharField(max_length=16, choices=KINDS, default=HTTP, db_default=HTTP)
    # "" for a poll endpoint; a broker's without its user name and password (EndpointAccess.encrypted_url has them)
    url = models.URLField(max_length=2000, blank=True)
    description = models.CharField(max_length=500, blank=True, default="")
    event_types = ArrayField(models.CharField(max_length=200), default=list, blank=True)
    channels = ArrayField(models.CharField(max_length=128), default=list, blank=True)
    enabled = models.BooleanField(default=True)
    disabled_reason = models.CharField(max_length=200, blank=True, default="")
    # Attempts in flight to it at once, across every worker; null: WEBHOOK_ENDPOINT_MAX_IN_FLIGHT.
    max_in_flight = models.PositiveIntegerField(null=True, blank=True)
    MAX_IN_FLIGHT_MAX = 1000   # SPEC §4: 1–1000 (the API's serializer and the admin's form hold it)
    UNORDERED = "unordered"
    FIFO = "fifo"
    ORDERINGS = [(UNORDERED, "unordered"), (FIFO, "fifo: one at a time, in event order")]
    ordering = models.CharField(max_length=16, choices=ORDERINGS, default=UNORDERED)
    # Attempts started per second at most, across every worker (null: no limit). throttle_tat is the
    # earliest time the next one may start (GCRA's theoretical arrival time), moved on by each claim.
    throttle_rate = models.PositiveIntegerField(null=True, blank=True)
    THROTTLE_RATE_MAX = 10000   # SPEC §4: null or 1–10000
    throttle_tat = models.DateTimeField(null=True, blank=True)
    # Since when every attempt has failed (the clock of WEBHOOK_DISABLE_AFTER_SECONDS).
    failing_since = models.DateTimeField(null=True, blank=True)
    # Circuit breaker: tripped after WEBHOOK_BREAKER_FAILURES consecutive failures; while tripped no
    # attempt starts before next_probe_at, then one probe; each failed probe doubles the pause.
    consecutive_failures = models.PositiveIntegerField(default=0)
    tripped_at = models.DateTimeField(null=True, blank=True)
    next_probe_at = models.DateTimeField(null=True, blank=True)
    failed_probes = models.PositiveIntegerField(default=0)
    # How attempts are signed (SPEC §15): v1 HMAC-SHA256 with a `whsec_` secret, or v1a ed25519 with a
    # `whsk_` private key (the receiver holds the public key). The secrets themselves are EndpointSecret rows.
    V1 = "v1"
    V1A = "v1a"
    SIGNATURES = [(V1, "v1: HMAC-SHA256, a shared secret"), (V1A, "v1a: ed25519, a public key")]
    signature = models.CharField(max_length=8, choices=SIGNATURES, default=V1, db_default=V1)
    # A payload filter (webhooks/filters.py) as the tenant wrote it, and compiled (intake reads only that).
    filter = models.JSONField(null=True, blank=True)
    filter_path = JsonPathField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    HEALTHY = "healthy"
    TRIPPED = "tripped"
    DISABLED = "disabled"

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["tenant", "enabled"], name="endpoint_tenant_enabled",
                         condition=models.Q(deleted_at__isnull=True)),
            # beat: tripped endpoints whose pause is over get their probe
            models.Index(fields=["next_probe_at"], name="endpoint_tripped",
                         condition=models.Q(tripped_at__isnull=False)),
        ]

    def __str__(self) -> str:
        # Also the admin's history (LogEntry.object_repr) and its pages: never the query or user info,
        # where receivers keep tokens and credentials.
        return f"{self.id} {url_without_secrets(self.url)}"

    @property
    def health_state(self) -> str:
        if not self.enabled or self.deleted_at is not None:
            return self.DISABLED
        return self.TRIPPED if self.tripped_at is not None else self.HEALTHY


class EndpointSecret(models.Model):
    """A signing secret, encrypted at rest (webhooks/crypto.py); after rotation the old one keeps signing
    until `expires_at`. Only `GET /api/v1/endpoints/{id}/secret` and the worker's signing read it."""

    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="secrets")
    # The Fernet token of the `whsec_…` secret (about 165 characters). Its column keeps the name and the
    # type (varchar) of `secret`, which the claim function (webhooks/sql/delivery_claim.sql) returns to
    # the worker to decrypt.
    encrypted_secret = models.CharField(max_length=500, db_column="secret")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    @property
    def secret(self) -> str:
        return crypto.decrypt(self.encrypted_secret)

    def __str__(self) -> str:
        return f"signing secret {self.pk} of {self.endpoint_id}"


class EndpointAccess(models.Model):
    """What an attempt needs to get into an endpoint that asks for more than a signature (SPEC §11): extra
    headers, an `Authorization` (basic, bearer or an OAuth2 client-credentials token) and a client
    certificate for mutual TLS; or a broker endpoint's destination (SPEC §14). A row only for endpoints that
    have one of them, so that the worker's per-batch look-up (webhooks/delivery/destinations/access.py) finds nothing for the others.

    Every secret is a Fernet token (webhooks/crypto.py, the signing secrets' keys; `reencrypt_secrets`
    rotates them): the header values, the password, bearer token or client secret, and the private key.
    What may be shown is kept beside them in clear: the header names, the auth without its secret, the
    certificate (public) with its subject and expiry.
    """

    BASIC = "basic"
    BEARER = "bearer"
    OAUTH2 = "oauth2_client_credentials"
    AUTH_TYPES = [(BASIC, "basic"), (BEARER, "bearer"), (OAUTH2, "OAuth2 client credentials")]

    endpoint = models.OneToOneField(Endpoint, primary_key=True, on_delete=models.CASCADE, related_name="access")
    header_names = ArrayField(models.CharField(max_length=64), default=list, blank=True)
    encrypted_headers = models.TextField(blank=True, default="")  # a JSON object {name: value}, encrypted
    auth_type = models.CharField(max_length=32, choices=AUTH_TYPES, blank=True, default="")
    # username (basic); token_url, client_id, scope, audience (oauth2): what the API shows
    auth_shown = models.JSONField(default=dict, blank=True)
    encrypted_auth_secret = models.TextField(blank=True, default="")  # password, token or client_secret
    certificate = models.TextField(blank=True, default="")  # PEM, public
    certificate_subject = models.CharField(max_length=1000, blank=True, default="")
    certificate_expires_at = models.DateTimeField(null=True, blank=True)
    encrypted_private_key = models.TextField(blank=True, default="")  # PEM, encrypted
    # A broker endpoint's destination (SPEC §14): its kind and fields, shown ({"kind": "amqp", "exchange": …,
    # "routing_key": …}), and its URL with credentials, encrypted (the endpoint's `url` is shown without them).
    destination = models.JSONField(default=dict, blank=True)
    encrypted_url = models.TextField(blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "endpoint access"

    def __str__(self) -> str:
        return f"access of {self.endpoint_id}"

    @property
    def is_empty(self) -> bool:
        return not (self.header_names or self.auth_type or self.certificate or self.destination)


class Event(models.Model):
    """Something that happened in a tenant's system, recorded exactly once per intake request.

    Partitioned a day at a time by id, as deliveries and attempts are (migration 0028,
    webhooks/services/partitions.py, which owns the partitions)."""

    id = models.CharField(primary_key=True, max_length=40, default=ids.event_id, editable=False)
    # Written once per intake request: no index of its own (event_tenant_type leads with it), and no
    # LIKE twins for the varchar keys (migration 0008): no query matches ids by pattern.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="events", db_index=False)
    type = models.CharField(max_length=200)
    channels = ArrayField(models.CharField(max_length=128), default=list, blank=True)
    # The exact webhook body `{"type","timestamp","data"}`, built once at intake so every attempt sends
    # identical bytes. The event's `data` is stored only here (see `data`).
    payload = models.BinaryField()
    # The intake request that recorded it, so delivery log lines join up with that request's.
    request_id = models.CharField(max_length=128, blank=True, default="")
    # The W3C traceparent of the intake's span that recorded it, when tracing is on (webhooks/tracing.py):
    # every attempt of its deliveries, however much later and in whichever worker, joins that trace.
    traceparent = models.CharField(max_length=55, null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["tenant", "type", "-id"], name="event_tenant_type")]

    def __str__(self) -> str:
        return f"{self.id} {self.type}"

    @property
    def data(self) -> Any:
        """The `data` the event was recorded with, read from its body (intake sets it as it builds one)."""
        if "_data" not in self.__dict__:
            self.__dict__["_data"] = json.loads(bytes(self.payload))["data"]
        return self.__dict__["_data"]


class Delivery(models.Model):
    """One event to one endpoint; its state machine lives in the database, not the broker."""

    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STATUSES = [(PENDING, "pending"), (SUCCEEDED, "succeeded"), (FAILED, "failed"), (CANCELLED, "cancelled")]

    id = models.CharField(primary_key=True, max_length=40, default=ids.delivery_id, editable=False)
    # The row is rewritten on every attempt's record, with every index: no index of its own for these
    # keys (nor the LIKE twin Django adds for varchar keys), as the composite indexes below lead with
    # each of them (tenant_status, event_endpoint, endpoint).
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="deliveries", db_index=False)
    # No database constraint on the event (nor on DeliveryAttempt.delivery): the foreign-key triggers cost
    # retention three fifths of its time (a check per deleted row at commit: 32 of 50 ms per batch of
    # 1,000 events) and intake a check per delivery. The rows are written by intake's one statement
    # (event and deliveries together), the record function (an attempt of the delivery it updates)
    # and retention (which deletes all three together), and by nothing else.
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="deliveries", db_index=False,
                              db_constraint=False)
    endpoint = models.ForeignKey(Endpoint, on_delete=models.PROTECT, related_name="deliveries", db_index=False)
    status = models.CharField(max_length=16, choices=STATUSES, default=PENDING)
    attempt_count = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # Set while it waits for its endpoint (in-flight cap reached, breaker tripped): it is in no queue
    # and holds no worker; the attempt that frees a slot (or the breaker's probe) hands it on.
    parked_at = models.DateTimeField(null=True, blank=True)
    # A poll endpoint's delivery: its place in the order its consumer is served, given when it is first
    # served (webhooks/services/polling.py); a cursor acknowledges the served ones up to its number.
    poll_seq = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "deliveries"
        constraints = [models.UniqueConstraint(fields=["event", "endpoint"], name="delivery_event_endpoint")]
        # Every index is paid for on each insert and on each record of an attempt that changes `status`;
        # a record that schedules a retry changes no indexed column and can be a HOT update. Publishing
        # does not touch the row at all (DeliveryOutbox). Each index serves a query named here, and
        # none duplicates another's leading columns.
        # pk: claim and record (herald_delivery_claim/record), GET /deliveries/{id}.
        # delivery_event_endpoint (unique): one delivery per event and endpoint; an event's deliveries
        #   (GET /events, ?event=), the cascade from an event. In the database it is an index of each day's
        #   partition (<partition>_event_endpoint): the table is partitioned by id (migration 0028), and an
        #   event's deliveries all lie in its day.
        indexes = [
            # the hand-on and beat's parked sweep: an endpoint's parked deliveries, oldest first
            models.Index(fields=["endpoint", "id"], name="delivery_parked", condition=models.Q(parked_at__isnull=False)),
            # the claim of a fifo endpoint's delivery: is an older one still pending?
            models.Index(fields=["endpoint", "id"], name="delivery_pending_order", condition=models.Q(status="pending")),
            # GET /deliveries?status= and the admin's status filter, newest first, within a tenant
            models.Index(fields=["tenant", "status", "-id"], name="delivery_tenant_status"),
            # GET /deliveries?endpoint=, the endpoint's health and chart, PROTECT on endpoint delete
            models.Index(fields=["endpoint", "-id"], name="delivery_endpoint"),
            # the admin's failed filter, newest first, and migration 0016's first count of failed rows
            # (index-only); an entry only when a delivery fails
            models.Index(fields=["-id"], name="delivery_failed", condition=models.Q(status="failed")),
            # a poll endpoint's served deliveries in the order they were served (an entry only once served)
            models.Index(fields=["endpoint", "poll_seq"], name="delivery_poll_seq",
                         condition=models.Q(poll_seq__isnull=False)),
            # a recovery's walk (webhooks/services/recovery.py): an endpoint's failed deliveries in a time
            # range, in event order (a delivery's created_at is its event's); an entry only when one fails
            models.Index(fields=["endpoint", "created_at", "id"], name="delivery_failed_endpoint",
                         condition=models.Q(status="failed")),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.status}"


class DeliveryLease(models.Model):
    """A delivery whose attempt is in flight: its worker holds it until `until` (the attempt's deadline
    plus a margin), and no other claim may take it before then.

    A row of its own rather than a column of the delivery, so that a claim writes three columns here
    instead of rewriting the delivery row and its indexes; the attempt's record deletes it. The
    endpoint is copied in, to count an endpoint's attempts in flight from this small table alone.
    An expired row is a lease whose worker died: the next claim takes it over, beat removes it.
    """

    delivery = models.OneToOneField(Delivery, primary_key=True, on_delete=models.CASCADE, related_name="lease",
                                    db_constraint=False)
    endpoint = models.ForeignKey(Endpoint, on_delete=models.DO_NOTHING, related_name="+", db_constraint=False,
                                 db_index=False)
    until = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["endpoint", "until"], name="lease_endpoint")]

    def __str__(self) -> str:
        return f"{self.delivery_id} until {self.until:%H:%M:%S}"


class DeliveryOutbox(models.Model):
    """A delivery that needs a task message (`published_at` NULL: due at `due_at`), or whose message is
    on its way through the broker (published at `published_at`).

    Intake, a record that schedules a retry and a manual retry insert the row; a relay publishes it
    (webhooks/delivery/relay.py) and stamps `published_at`; the claim of the delivery deletes it, whatever the
    claim decides (send, park, close). Beat's dispatcher publishes again what was published long
    enough ago to be lost. A narrow row of its own, so that publishing writes two small index entries
    here instead of rewriting the delivery row and its six indexes (10,000 published in about a
    third of the database time).
    """

    delivery = models.OneToOneField(Delivery, primary_key=True, on_delete=models.CASCADE, related_name="outbox",
                                    db_constraint=False)
    due_at = models.DateTimeField()
    published_at = models.DateTimeField(null=True, blank=True)
    # Its message goes (or went) to the periodic queue: a retry, a hand-on or a re-publication; a first
    # attempt goes to the main one. The dispatcher's lost check reads the queue's progress by it.
    periodic = models.BooleanField(default=False)
    # The delivery's tenant, for the relays' fair choice (webhooks/delivery/scheduling.py). Written by the
    # statements that write an unpublished row; any other writer (or a row made unpublished again) gets it
    # from the delivery, by a trigger (webhooks/sql/outbox_tenant.sql). A published row may have none.
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False,
                               db_index=False, related_name="+")

    class Meta:
        indexes = [
            # the relays' fair choice: the tenants with unpublished rows (skipped through), each one's oldest
            models.Index(fields=["tenant", "due_at"], name="outbox_fair", condition=models.Q(published_at__isnull=True)),
            # the relays and the dispatcher: what is due and unpublished, oldest first
            models.Index(fields=["due_at"], name="outbox_due", condition=models.Q(published_at__isnull=True)),
            # the dispatcher: published and never claimed, oldest first (the lost-message check)
            models.Index(fields=["published_at"], name="outbox_published",
                         condition=models.Q(published_at__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.delivery_id} {'published' if self.published_at else 'due'}"


class QueueProgress(models.Model):
    """The mark of the newest delivery message consumed from a queue, by any worker (webhooks/progress.py)."""

    queue = models.CharField(primary_key=True, max_length=200)
    consumed_mark = models.DateTimeField()
    updated_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.queue} consumed up to {self.consumed_mark:%H:%M:%S}"


class DeliveryCount(models.Model):
    """Pending and failed deliveries, kept by PostgreSQL triggers on the delivery table as its rows
    change (migration 0016), so that /metrics adds up a few shard rows instead of counting deliveries.

    Every insert, status change and delete of a delivery, by whatever writes it, adds its change to
    one shard row in the writer's own transaction: the sums are exact at any snapshot. A writer takes
    a shard no concurrent transaction holds (a transaction-level advisory lock per shard), so writers
    never wait for one another here. /metrics (webhooks/delivery/metrics.py) adds the shards up.
    """

    shard = models.SmallIntegerField(primary_key=True)
    pending = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"shard {self.shard}: {self.pending} pending, {self.failed} failed"


class DeliveryAttempt(models.Model):
    """One HTTP POST of a delivery, recorded truthfully whatever its outcome."""

    # No index of its own: the unique (delivery, number) index leads with it (one index less per attempt).
    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempts", db_index=False,
                                 db_constraint=False)  # see Delivery.event
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField()
    response_status = models.PositiveIntegerField(null=True, blank=True)
    response_body = models.TextField(blank=True, default="")
    error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # Partitioned by delivery_id (migration 0028): in the database the primary key is (id, delivery_id), as
        # PostgreSQL asks for the partition key in it; `id` comes from its sequence and stays unique.
        ordering = ["delivery", "number"]
        constraints = [models.UniqueConstraint(fields=["delivery", "number"], name="attempt_delivery_number")]

    def __str__(self) -> str:
        return f"attempt {self.number}"


class Recovery(models.Model):
    """A resend of an endpoint's failed deliveries whose events were created in [since, until) (SPEC §11).

    Beat-free and web-free: a task (webhooks.recovery_step) walks the deliveries in event order and
    hands them, a batch at a time, to the manual retry (webhooks/delivery/retries.py); the next batch
    goes once every delivery of this one has had its attempt. `batch` and `released_at` are that batch;
    `cursor_at`/`cursor_id` the last delivery released; `step` the number of the step task that may run
    next, so that a step sent again by beat (a lost message) never doubles the chain.
    """

    RUNNING = "running"
    COMPLETED = "completed"
    STATUSES = [(RUNNING, "running"), (COMPLETED, "completed")]

    id = models.CharField(primary_key=True, max_length=40, default=ids.recovery_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="recoveries")
    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="recoveries")
    since = models.DateTimeField()
    until = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=STATUSES, default=RUNNING)
    # failed deliveries in the range when it was created; of them, how many it has sent again
    total = models.PositiveIntegerField(default=0)
    done = models.PositiveIntegerField(default=0)
    done_before = models.PositiveIntegerField(default=0)  # `done` when the current batch was released
    batch = ArrayField(models.CharField(max_length=40), default=list, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)
    cursor_at = models.DateTimeField(null=True, blank=True)
    cursor_id = models.CharField(max_length=40, blank=True, default="")
    step = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "recoveries"
        indexes = [
            # beat: running recoveries whose step is overdue (a lost message)
            models.Index(fields=["updated_at"], name="recovery_running", condition=models.Q(status="running")),
        ]
        constraints = [
            # One running recovery per endpoint (SPEC §11): a second is refused by the index itself, so two
            # created at the same moment cannot both get in (the second insert waits for the first's commit).
            models.UniqueConstraint(fields=["endpoint"], condition=models.Q(status="running"),
                                    name="recovery_one_running"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.status} {self.done}/{self.total}"


class PortalLink(models.Model):
    """A one-time link into a tenant's portal (portal/): only the SHA-256 of its token is kept."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="portal_links")
    token_hash = models.CharField(max_length=64, unique=True)
    # The API credential that made it (intake.ApiCredential's id; no foreign key: this app does not
    # depend on intake). Revoking that credential ends the sessions the link opened (`ended_at`).
    credential_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    # Set when its credential is revoked: the link no longer opens, and the session it opened ends.
    ended_at = models.DateTimeField(null=True, blank=True)
    # How the session it opens looks (SPEC §15): {name?, logo_url?, accent?}, checked by the API.
    theme = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return f"portal link of {self.tenant_id}, until {self.expires_at:%Y-%m-%d %H:%M}"


DISPATCHER = "dispatcher"


class Heartbeat(models.Model):
    """When a periodic job last ran (`dispatcher`: beat's dispatcher, see /healthz and /metrics), and when
    each worker last showed it was consuming (`worker:<hostname>`, webhooks/liveness.py)."""

    name = models.CharField(primary_key=True, max_length=100)
    at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name} at {self.at:%H:%M:%S}"
