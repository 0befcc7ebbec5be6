"""Input and output serializers of the REST API; they parse and render, they hold no logic."""
import re

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.utils import json as drf_json

from webhooks import event_types
from webhooks.conf import herald_settings
from webhooks.models import Delivery, DeliveryAttempt, Endpoint, Event, EventType, Recovery
from webhooks.selectors import endpoint_access
from webhooks.services import polling
from webhooks.services.endpoints import endpoint_max_in_flight

_datetime = serializers.DateTimeField()


def _iso(value):
    return None if value is None else _datetime.to_representation(value)

MAX_CHANNELS = 10


def _validate_patterns(values: list[str]) -> list[str]:
    bad = [value for value in values if not event_types.is_valid_pattern(value)]
    if bad:
        raise serializers.ValidationError(
            f"Not an event type or pattern (dot-separated [A-Za-z0-9_] segments, optional trailing .*): {bad}")
    return values


CHANNEL_PATTERN = r"[A-Za-z0-9_.:-]{1,128}"
MAX_EVENT_CHANNELS = 5
MAX_EVENT_TYPE_LENGTH = 200


class _ChannelField(serializers.RegexField):
    def __init__(self, **kwargs):
        super().__init__(f"^{CHANNEL_PATTERN}$", **kwargs)


_AUTH_SCHEMA = {
    "oneOf": [
        {"type": "object", "required": ["type", "username", "password"], "additionalProperties": False,
         "properties": {"type": {"type": "string", "enum": ["basic"]}, "username": {"type": "string"},
                        "password": {"type": "string", "writeOnly": True}}},
        {"type": "object", "required": ["type", "token"], "additionalProperties": False,
         "properties": {"type": {"type": "string", "enum": ["bearer"]}, "token": {"type": "string", "writeOnly": True}}},
        {"type": "object", "required": ["type", "token_url", "client_id", "client_secret"],
         "additionalProperties": False,
         "properties": {"type": {"type": "string", "enum": ["oauth2_client_credentials"]},
                        "token_url": {"type": "string", "format": "uri"}, "client_id": {"type": "string"},
                        "client_secret": {"type": "string", "writeOnly": True},
                        "scope": {"type": "string", "nullable": True}, "audience": {"type": "string", "nullable": True}}},
    ],
    "nullable": True,
}


@extend_schema_field({"type": "object", "additionalProperties": {"type": "string", "maxLength": 1024},
                      "maxProperties": 20, "nullable": True})
class _HeadersInput(serializers.JSONField):
    """Checked by the endpoint service (webhooks/delivery/destinations/access.py), which owns the rules."""


@extend_schema_field(_AUTH_SCHEMA)
class _AuthInput(serializers.JSONField):
    pass


@extend_schema_field({"type": "object", "required": ["certificate", "private_key"], "additionalProperties": False,
                      "nullable": True,
                      "properties": {"certificate": {"type": "string"},
                                     "private_key": {"type": "string", "writeOnly": True}}})
class _ClientCertificateInput(serializers.JSONField):
    pass


class EndpointCreateInput(serializers.Serializer):
    kind = serializers.ChoiceField(choices=[kind for kind, _ in Endpoint.KINDS], required=False, default=Endpoint.HTTP,
                                   help_text=(
                                       "http: Herald POSTs each message to `url`. poll: no `url`; its consumer "
                                       "reads the messages with `GET /endpoints/{id}/messages` (or `herald listen`). "
                                       "amqp, redis_stream, nats: each message goes to the tenant's broker at `url` "
                                       "(with the kind's fields: exchange and routing_key; stream and maxlen; subject)."))
    url = serializers.CharField(max_length=2000, required=False, help_text=(
        "Required for kind http (an http or https URL) and the broker kinds (amqp://, redis://, nats://, with "
        "credentials if the broker wants them: stored encrypted, never returned); none for poll."))
    # The broker kinds' fields (SPEC §14), checked by their destination modules (webhooks/delivery/destinations/)
    exchange = serializers.CharField(max_length=255, required=False, allow_blank=True, trim_whitespace=False,
                                     help_text="amqp: the exchange to publish to (\"\" for the default exchange).")
    routing_key = serializers.CharField(max_length=255, required=False, trim_whitespace=False,
                                        help_text="amqp: the routing key; the message is mandatory, so a key no "
                                                  "queue is bound to is a failed attempt.")
    stream = serializers.CharField(max_length=512, required=False, trim_whitespace=False,
                                   help_text="redis_stream: the stream's key (XADD).")
    maxlen = serializers.IntegerField(min_value=1, max_value=10_000_000, required=False, allow_null=True,
                                      help_text="redis_stream: trim the stream to about this many entries "
                                                "(XADD MAXLEN ~ N); null: no trimming.")
    subject = serializers.CharField(max_length=255, required=False, trim_whitespace=False,
                                    help_text="nats: the subject to publish to; a JetStream stream must take it.")
    event_types = serializers.ListField(child=serializers.CharField(max_length=200), required=False,
                                        default=list, max_length=100)
    channels = serializers.ListField(child=_ChannelField(), required=False, default=list,
                                     max_length=MAX_CHANNELS)
    description = serializers.CharField(max_length=500, required=False, default="", allow_blank=True)
    max_in_flight = serializers.IntegerField(min_value=1, max_value=Endpoint.MAX_IN_FLIGHT_MAX, required=False,
                                             allow_null=True, default=None, help_text=(
                                                 "Attempts in flight to this endpoint at once, across all workers; "
                                                 "null: the deployment's default (WEBHOOK_ENDPOINT_MAX_IN_FLIGHT)."))
    throttle_rate = serializers.IntegerField(min_value=1, max_value=Endpoint.THROTTLE_RATE_MAX, required=False,
                                             allow_null=True, default=None, help_text=(
                                                 "Attempts started per second at most, across all workers; "
                                                 "null: no limit."))
    ordering = serializers.ChoiceField(choices=[Endpoint.UNORDERED, Endpoint.FIFO], required=False,
                                       default=Endpoint.UNORDERED, help_text=(
                                           "fifo: one delivery at a time, in event order; the next goes only "
                                           "once the previous one succeeded, failed or was cancelled."))
    signature = serializers.ChoiceField(choices=[Endpoint.V1, Endpoint.V1A], required=False, default=Endpoint.V1,
                                        help_text=(
                                            "v1: HMAC-SHA256 with a `whsec_` secret. v1a: ed25519; `GET …/secret` "
                                            "returns the `whpk_` public key only. Changing it is a rotation: the "
                                            "current key keeps signing for 24 h beside the new one."))
    filter = serializers.JSONField(required=False, allow_null=True, default=None, help_text=(
        "null, or a JSON object (at most 4 KiB) matched against the event's {type, data, channels}: only "
        "matching events are delivered. Nested keys address nested fields; a plain value is equality (on an "
        "array, membership); operators $eq $neq $in $nin $gt $gte $lt $lte $exists $startsWith $and $or $not. "
        "Example: {\"data\": {\"amount\": {\"$gte\": 1000}, \"currency\": {\"$in\": [\"EUR\", \"USD\"]}}}."))

    headers = _HeadersInput(required=False, allow_null=True, help_text=(
        "Up to 20 extra HTTP headers sent with every attempt (names [A-Za-z0-9-], at most 64 characters; "
        "values printable ASCII, at most 1 KiB). Names Herald sets itself (webhook-*, content-type, "
        "content-length, host, user-agent, authorization, connection, transfer-encoding, …) are refused. "
        "Stored encrypted and never returned (the endpoint shows `header_names`). Replaces the current set; "
        "null or {} removes them."))
    auth = _AuthInput(required=False, allow_null=True, help_text=(
        "null, {type: basic, username, password}, {type: bearer, token} or {type: oauth2_client_credentials, "
        "token_url, client_id, client_secret, scope?, audience?}. Secrets are stored encrypted and never "
        "returned."))
    client_certificate = _ClientCertificateInput(required=False, allow_null=True, help_text=(
        "null or {certificate, private_key}, both PEM (the key unencrypted): attempts use it for mutual TLS. "
        "The key is stored encrypted and never returned."))

    def validate_event_types(self, value):
        return _validate_patterns(value)

    def validate_url(self, value):
        """An HTTP endpoint's URL is checked with the other fields (every error at once); a broker's by its kind's
        module, in the endpoint service."""
        kind = self.initial_data.get("kind", Endpoint.HTTP) if isinstance(self.initial_data, dict) else Endpoint.HTTP
        if kind == Endpoint.HTTP:
            serializers.URLField().run_validators(value)
        return value

    def validate(self, attrs):
        if attrs["kind"] == Endpoint.POLL and "url" in attrs:
            raise serializers.ValidationError({"url": ["A poll endpoint has no URL: its consumer reads its messages."]})
        if attrs["kind"] != Endpoint.POLL and "url" not in attrs:
            raise serializers.ValidationError({"url": ["This field is required."]})
        return attrs


class EndpointUpdateInput(EndpointCreateInput):
    kind = None  # set once, at creation
    url = serializers.CharField(max_length=2000, required=False)
    enabled = serializers.BooleanField(required=False)

    def validate_url(self, value):
        return value  # the endpoint's kind decides (the endpoint service checks it)

    def validate(self, attrs):
        return attrs


class EndpointHealthOutput(serializers.Serializer):
    state = serializers.ChoiceField(choices=[Endpoint.HEALTHY, Endpoint.TRIPPED, Endpoint.DISABLED])
    consecutive_failures = serializers.IntegerField()
    failing_since = serializers.DateTimeField(allow_null=True)
    next_probe_at = serializers.DateTimeField(allow_null=True)


class EndpointAuthOutput(serializers.Serializer):
    """The endpoint's auth without its secret (password, token, client_secret)."""

    type = serializers.ChoiceField(choices=["basic", "bearer", "oauth2_client_credentials"])
    username = serializers.CharField(required=False)
    token_url = serializers.CharField(required=False)
    client_id = serializers.CharField(required=False)
    scope = serializers.CharField(required=False, allow_null=True)
    audience = serializers.CharField(required=False, allow_null=True)


class EndpointCertificateOutput(serializers.Serializer):
    subject = serializers.CharField(help_text="The client certificate's subject (RFC 4514).")
    expires_at = serializers.DateTimeField(help_text="When the certificate expires (notAfter).")


class EndpointOutput(serializers.ModelSerializer):
    """An endpoint as the API shows it: never its secret (`EndpointSecretOutput`, from `…/secret` only),
    nor its header values, auth secret or private key."""

    url = serializers.SerializerMethodField()
    max_in_flight = serializers.SerializerMethodField()
    health = serializers.SerializerMethodField()
    header_names = serializers.SerializerMethodField()
    auth = serializers.SerializerMethodField()
    client_certificate = serializers.SerializerMethodField()

    class Meta:
        model = Endpoint
        fields = ["id", "kind", "url", "description", "event_types", "channels", "enabled", "disabled_reason",
                  "max_in_flight", "throttle_rate", "ordering", "signature", "filter", "header_names", "auth",
                  "client_certificate", "health", "created_at", "updated_at"]

    def get_header_names(self, endpoint: Endpoint) -> list[str]:
        access = endpoint_access(endpoint=endpoint)
        return list(access.header_names) if access else []

    @extend_schema_field(EndpointAuthOutput(allow_null=True))
    def get_auth(self, endpoint: Endpoint) -> dict | None:
        access = endpoint_access(endpoint=endpoint)
        if access is None or not access.auth_type:
            return None
        return {"type": access.auth_type, **access.auth_shown}

    @extend_schema_field(EndpointCertificateOutput(allow_null=True))
    def get_client_certificate(self, endpoint: Endpoint) -> dict | None:
        access = endpoint_access(endpoint=endpoint)
        if access is None or not access.certificate:
            return None
        return {"subject": access.certificate_subject, "expires_at": _iso(access.certificate_expires_at)}

    @extend_schema_field(serializers.URLField(allow_null=True))
    def get_url(self, endpoint: Endpoint) -> str | None:
        return endpoint.url or None  # a poll endpoint has none; a broker's is shown without its credentials

    def to_representation(self, endpoint: Endpoint) -> dict:
        """A broker endpoint shows its kind's fields too (exchange, routing_key; stream, maxlen; subject)."""
        data = super().to_representation(endpoint)
        access = endpoint_access(endpoint=endpoint) if endpoint.kind not in (Endpoint.HTTP, Endpoint.POLL) else None
        if access is not None:
            data.update({name: value for name, value in access.destination.items() if name != "kind"})
        return data

    def get_max_in_flight(self, endpoint: Endpoint) -> int:
        return endpoint_max_in_flight(endpoint)

    @extend_schema_field(EndpointHealthOutput)
    def get_health(self, endpoint: Endpoint) -> dict:
        state = endpoint.health_state
        return {"state": state, "consecutive_failures": endpoint.consecutive_failures,
                "failing_since": _iso(endpoint.failing_since),
                "next_probe_at": _iso(endpoint.next_probe_at) if state == Endpoint.TRIPPED else None}



class EndpointSecretOutput(serializers.Serializer):
    secret = serializers.CharField(required=False, help_text=(
        "The current signing secret, `whsec_` + base64 of 32 bytes (a `v1` endpoint)."))
    public_key = serializers.CharField(required=False, help_text=(
        "The current ed25519 public key, `whpk_` + base64 of the raw 32 bytes (a `v1a` endpoint; the private "
        "key is never returned)."))


class PortalThemeInput(serializers.Serializer):
    """How the portal session looks: shown on its pages, every value escaped."""

    name = serializers.CharField(max_length=100, required=False, help_text="Shown in the page header and title.")
    logo_url = serializers.URLField(max_length=2000, required=False, help_text="An https image URL.")
    accent = serializers.RegexField(r"\A#(?:[0-9a-fA-F]{3}|[0-9a-fA-F]{6})\Z", required=False,
                                    help_text="A colour, #rgb or #rrggbb: the header's background.")

    def validate_logo_url(self, value: str) -> str:
        if not value.lower().startswith("https://"):
            raise serializers.ValidationError("The logo URL must be https.")
        return value


class PortalLinkInput(serializers.Serializer):
    theme = PortalThemeInput(required=False, help_text="How that session's pages look (optional).")


class PortalLinkOutput(serializers.Serializer):
    url = serializers.URLField(help_text="Open it once, within `expires_at`, to start a portal session.")
    expires_at = serializers.DateTimeField()


class EventCreateInput(serializers.Serializer):
    type = serializers.CharField(max_length=MAX_EVENT_TYPE_LENGTH)
    data = serializers.JSONField()
    channels = serializers.ListField(child=_ChannelField(), required=False, default=list,
                                     max_length=MAX_EVENT_CHANNELS)

    def validate_type(self, value: str) -> str:
        if not event_types.is_valid_type(value):
            raise serializers.ValidationError("Use dot-separated segments of [A-Za-z0-9_], e.g. invoice.paid.")
        if event_types.is_reserved(value):
            raise serializers.ValidationError(
                f"Types starting with '{event_types.RESERVED_PREFIX}' are reserved for Herald's own operational "
                "events; endpoints may subscribe to them, clients may not post them.")
        return value


_CHANNEL_RE = re.compile(CHANNEL_PATTERN)


def event_create_input(data) -> dict | None:
    """EventCreateInput's validated data for an input it accepts as it is, built without the serializer
    (whose per-request copy of its fields was a tenth of an intake request's CPU); None for anything
    else, which the serializer then validates and explains. A test holds the two equal."""
    if type(data) is not dict:
        return None
    event_type, channels = data.get("type"), data.get("channels", [])
    if (type(event_type) is not str or data.get("data") is None or type(channels) is not list
            or len(channels) > MAX_EVENT_CHANNELS):
        return None
    event_type = event_type.strip()  # as CharField trims
    if (len(event_type) > MAX_EVENT_TYPE_LENGTH or not event_types.is_valid_type(event_type)
            or event_types.is_reserved(event_type)
            or not all(type(c) is str and _CHANNEL_RE.fullmatch(c) for c in channels)):
        return None
    try:  # as JSONField checks: `-1e400` parses, as -inf, but is not JSON
        drf_json.dumps(data["data"])
    except (TypeError, ValueError):
        return None
    return {"type": event_type, "data": data["data"], "channels": list(channels)}


MAX_BATCH_EVENTS = 500


class EventBatchCreateInput(serializers.Serializer):
    """The body of `POST /events/batch` (for the OpenAPI schema; `event_batch_input` validates it)."""

    events = EventCreateInput(many=True, min_length=1, max_length=MAX_BATCH_EVENTS)


def event_batch_input(data) -> list[dict]:
    """The validated events of a batch, in order; or a ValidationError whose `errors` are keyed by JSON
    pointer into the body (`/events`, `/events/3/type`, `/events/3/channels/0`), every invalid event's."""
    events = data.get("events") if isinstance(data, dict) else None
    if not isinstance(events, list):
        raise serializers.ValidationError({"/events": ["A list of 1 to %d events is required." % MAX_BATCH_EVENTS]})
    if not 1 <= len(events) <= MAX_BATCH_EVENTS:
        raise serializers.ValidationError(
            {"/events": [f"A batch holds 1 to {MAX_BATCH_EVENTS} events; this one has {len(events)}."]})
    valid: list[dict] = []
    errors: dict[str, list[str]] = {}
    for index, item in enumerate(events):
        fast = event_create_input(item)
        if fast is not None:
            valid.append(fast)
            continue
        if not isinstance(item, dict):
            errors[f"/events/{index}"] = ["Each event is an object {type, data, channels?}."]
            continue
        serializer = EventCreateInput(data=item)
        if serializer.is_valid():
            valid.append(dict(serializer.validated_data))
        else:
            _pointer_errors(serializer.errors, f"/events/{index}", errors)
    if errors:
        raise serializers.ValidationError(errors)
    return valid


def _pointer_errors(detail, at: str, out: dict[str, list[str]]) -> None:
    """DRF's nested error detail flattened to {JSON pointer: [messages]}."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            name = str(key).replace("~", "~0").replace("/", "~1")
            _pointer_errors(value, at if key == "non_field_errors" else f"{at}/{name}", out)
    elif isinstance(detail, list) and detail and all(isinstance(item, (dict, list)) for item in detail):
        for index, item in enumerate(detail):
            if item:
                _pointer_errors(item, f"{at}/{index}", out)
    else:
        out.setdefault(at, []).extend(str(item) for item in (detail if isinstance(detail, list) else [detail]))


class DeliverySummaryOutput(serializers.Serializer):
    id = serializers.CharField()
    endpoint_id = serializers.CharField()
    status = serializers.ChoiceField(choices=[choice for choice, _ in Delivery.STATUSES])


class EventOutput(serializers.Serializer):
    """Renders every 202 of the intake hot path. The fields describe the output (and the OpenAPI
    schema); `to_representation` builds the same dict directly, without the per-request copy of every
    field that DRF makes (about a tenth of an intake request's CPU). A test holds the two equal."""

    id = serializers.CharField()
    type = serializers.CharField()
    data = serializers.JSONField()
    channels = serializers.ListField(child=serializers.CharField())
    created_at = serializers.DateTimeField()
    deliveries = serializers.SerializerMethodField()

    @extend_schema_field(DeliverySummaryOutput(many=True))
    def get_deliveries(self, event: Event) -> list[dict]:
        deliveries = getattr(event, "delivery_list", None)
        if deliveries is None:
            deliveries = event.deliveries.all()
        return [{"id": d.id, "endpoint_id": d.endpoint_id, "status": d.status} for d in deliveries]

    def to_representation(self, event: Event) -> dict:
        created_at = timezone.localtime(event.created_at, timezone.get_current_timezone()).isoformat()
        if created_at.endswith("+00:00"):
            created_at = created_at[:-6] + "Z"  # as DRF's DateTimeField renders it
        return {"id": event.id, "type": event.type, "data": event.data, "channels": [str(c) for c in event.channels],
                "created_at": created_at, "deliveries": self.get_deliveries(event)}


class AttemptOutput(serializers.ModelSerializer):
    class Meta:
        model = DeliveryAttempt
        fields = ["number", "started_at", "duration_ms", "response_status", "response_body", "error"]


class DeliveryOutput(serializers.ModelSerializer):
    event_id = serializers.CharField()
    endpoint_id = serializers.CharField()

    class Meta:
        model = Delivery
        fields = ["id", "event_id", "endpoint_id", "status", "attempt_count", "next_attempt_at", "created_at",
                  "updated_at"]


class DeliveryDetailOutput(DeliveryOutput):
    attempts = AttemptOutput(many=True)

    class Meta(DeliveryOutput.Meta):
        fields = DeliveryOutput.Meta.fields + ["attempts"]


class CreatedRangeInput(serializers.Serializer):
    """`?created_after=` (inclusive) and `?created_before=` (exclusive): ISO 8601; without an offset, UTC."""

    created_after = serializers.DateTimeField(required=False, help_text=(
        "Only what was created at or after this time (ISO 8601; without an offset, UTC)."))
    created_before = serializers.DateTimeField(required=False, help_text=(
        "Only what was created before this time (ISO 8601; without an offset, UTC)."))

    def validate(self, attrs):
        after, before = attrs.get("created_after"), attrs.get("created_before")
        if after is not None and before is not None and after >= before:
            raise serializers.ValidationError({"created_before": ["Must be later than created_after."]})
        return attrs


class DeliveryFilterInput(CreatedRangeInput):
    status = serializers.ChoiceField(choices=[choice for choice, _ in Delivery.STATUSES], required=False)
    endpoint = serializers.CharField(required=False, max_length=40)
    event = serializers.CharField(required=False, max_length=40)


class EventTypeCreateInput(serializers.Serializer):
    name = serializers.CharField(max_length=MAX_EVENT_TYPE_LENGTH, help_text="The event type, e.g. invoice.paid.")
    description = serializers.CharField(max_length=2000, required=False, default="", allow_blank=True)
    schema = serializers.JSONField(required=False, allow_null=True, default=None, help_text=(
        "A JSON Schema (draft 2020-12) that an event's `data` must match at intake; null: no check."))
    example = serializers.JSONField(required=False, allow_null=True, default=None, help_text=(
        "An example of `data`; it must match `schema`."))


class EventTypeUpdateInput(serializers.Serializer):
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    schema = serializers.JSONField(required=False, allow_null=True)
    example = serializers.JSONField(required=False, allow_null=True)


class EventTypeOutput(serializers.ModelSerializer):
    class Meta:
        model = EventType
        fields = ["id", "name", "description", "schema", "example", "created_at", "updated_at"]


class RecoveryCreateInput(serializers.Serializer):
    since = serializers.DateTimeField(help_text=(
        "Resend the failed deliveries of events created at or after this time (ISO 8601; without an offset, UTC)."))
    until = serializers.DateTimeField(required=False, allow_null=True, default=None, help_text=(
        "…and before this time; null or absent: up to now."))

    def validate(self, attrs):
        if attrs["until"] is not None and attrs["since"] >= attrs["until"]:
            raise serializers.ValidationError({"until": ["Must be later than since."]})
        return attrs


class RecoveryOutput(serializers.ModelSerializer):
    endpoint_id = serializers.CharField()
    total = serializers.IntegerField(help_text="Failed deliveries in the range when the recovery was created.")
    done = serializers.IntegerField(help_text=(
        "Of them, how many it has sent again so far (each counted once its attempt is made). A delivery sent "
        "again meanwhile by hand or by another recovery is left out, so a completed recovery may show fewer."))

    class Meta:
        model = Recovery
        fields = ["id", "endpoint_id", "since", "until", "status", "total", "done", "created_at", "completed_at"]


def _page(name: str, item_serializer) -> type[serializers.Serializer]:
    """The list envelope `{"data": [...], "next_cursor": ...}`, for the OpenAPI schema."""
    return type(name, (serializers.Serializer,), {
        "data": item_serializer(many=True),
        "next_cursor": serializers.CharField(allow_null=True),
    })


EndpointPageOutput = _page("EndpointPage", EndpointOutput)
EventPageOutput = _page("EventPage", EventOutput)
DeliveryPageOutput = _page("DeliveryPage", DeliveryOutput)
EventTypePageOutput = _page("EventTypePage", EventTypeOutput)


class EventBatchOutput(serializers.Serializer):
    """The answer of `POST /events/batch`: every event, in the order sent, as `POST /events` answers it."""

    data = EventOutput(many=True)


class MessagesQueryInput(serializers.Serializer):
    after = serializers.RegexField(r"^[0-9]{1,19}$", required=False, help_text=(
        "A `next_cursor` this endpoint returned: acknowledges every message served up to it (they become "
        "succeeded), and the page starts after it. Without it, the page starts at the first message not "
        "acknowledged."), error_messages={"invalid": "Not a cursor: pass a next_cursor this endpoint returned."})
    limit = serializers.IntegerField(min_value=1, max_value=polling.MAX_LIMIT, required=False,
                                     default=polling.MAX_LIMIT)
    wait = serializers.FloatField(min_value=0, max_value=herald_settings.polling.POLL_MAX_WAIT_SECONDS, required=False,
                                  default=0,
                                  help_text="With nothing to serve, wait up to this many seconds for a message.")

    def validate_after(self, value: str) -> int:
        if int(value) > polling.MAX_CURSOR:
            raise serializers.ValidationError("Not a cursor: pass a next_cursor this endpoint returned.")
        return int(value)


class MessageOutput(serializers.Serializer):
    delivery_id = serializers.CharField()
    headers = serializers.DictField(child=serializers.CharField(), help_text=(
        "The Standard Webhooks headers a POST of this message would carry now (webhook-id, webhook-timestamp, "
        "webhook-signature, content-type, user-agent)."))
    body = serializers.CharField(help_text="The body a POST would carry, byte for byte (UTF-8).")


class MessagePageOutput(serializers.Serializer):
    data = MessageOutput(many=True)
    next_cursor = serializers.CharField(help_text="Pass it as `after` to acknowledge this page and read on.")


class EventFilterInput(CreatedRangeInput):
    type = serializers.CharField(required=False, max_length=200)


# --- Platform API (SPEC §10) ---------------------------------------------------------------------
TENANT_UID_PATTERN = r"[A-Za-z0-9_.:-]{1,128}"
TENANT_METADATA_MAX_BYTES = 4096
TENANT_MAX_ENDPOINTS_CEILING = 100_000


def _validate_metadata(value):
    if not isinstance(value, dict):
        raise serializers.ValidationError("Must be a JSON object.")
    size = len(drf_json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
    if size > TENANT_METADATA_MAX_BYTES:
        raise serializers.ValidationError(
            f"At most {TENANT_METADATA_MAX_BYTES} bytes of JSON (this is {size}).")
    return value


DELIVERY_WEIGHT_HELP = ("1-100: its share of the delivery workers, in proportion to the others' weights, while "
                        "other tenants have deliveries waiting too.")


class TenantCreateInput(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    uid = serializers.RegexField(f"^{TENANT_UID_PATTERN}$", required=False, allow_null=True, default=None,
                                 help_text="Your own id for this customer: 1-128 of [A-Za-z0-9_.:-], not "
                                           "starting with tnt_, unique among your tenants.")
    max_endpoints = serializers.IntegerField(min_value=0, max_value=TENANT_MAX_ENDPOINTS_CEILING, required=False,
                                             allow_null=True, default=None,
                                             help_text="Endpoints it may have; null: TENANT_MAX_ENDPOINTS.")
    delivery_weight = serializers.IntegerField(min_value=1, max_value=100, required=False, default=1,
                                               help_text=DELIVERY_WEIGHT_HELP)
    metadata = serializers.JSONField(required=False, default=dict,
                                     help_text="A JSON object of at most 4 KiB, yours to use.")

    def validate_uid(self, value):
        if value is not None and value.startswith("tnt_"):
            raise serializers.ValidationError("A uid may not start with tnt_ (that is how tenant ids start).")
        return value

    def validate_metadata(self, value):
        return _validate_metadata(value)


class TenantUpdateInput(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False)
    max_endpoints = serializers.IntegerField(min_value=0, max_value=TENANT_MAX_ENDPOINTS_CEILING, required=False,
                                             allow_null=True,
                                             help_text="Endpoints it may have; null: TENANT_MAX_ENDPOINTS.")
    delivery_weight = serializers.IntegerField(min_value=1, max_value=100, required=False,
                                               help_text=DELIVERY_WEIGHT_HELP)
    metadata = serializers.JSONField(required=False)

    def validate_metadata(self, value):
        return _validate_metadata(value)


class TenantFilterInput(serializers.Serializer):
    uid = serializers.CharField(required=False, max_length=128)


class TenantOutput(serializers.Serializer):
    id = serializers.CharField(help_text="`tnt_…`")
    uid = serializers.CharField(allow_null=True)
    name = serializers.CharField()
    max_endpoints = serializers.IntegerField(allow_null=True, help_text="null: the deployment's TENANT_MAX_ENDPOINTS.")
    delivery_weight = serializers.IntegerField(help_text=DELIVERY_WEIGHT_HELP)
    metadata = serializers.DictField()
    created_at = serializers.DateTimeField()


TenantPageOutput = _page("TenantPage", TenantOutput)


class CredentialOutput(serializers.Serializer):
    id = serializers.CharField(source="public_id", help_text="`cred_…`")
    token = serializers.CharField(help_text="The bearer token: shown only in this answer.")
    created_at = serializers.DateTimeField()
