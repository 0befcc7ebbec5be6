"""Input and output serializers of the REST API; they parse and render, they hold no logic."""
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from webhooks import event_types
from webhooks.models import Delivery, DeliveryAttempt, Endpoint, Event

MAX_CHANNELS = 10


def _validate_patterns(values: list[str]) -> list[str]:
    bad = [value for value in values if not event_types.is_valid_pattern(value)]
    if bad:
        raise serializers.ValidationError(
            f"Not an event type or pattern (dot-separated [A-Za-z0-9_] segments, optional trailing .*): {bad}")
    return values


class _ChannelField(serializers.RegexField):
    def __init__(self, **kwargs):
        super().__init__(r"^[A-Za-z0-9_.:-]{1,128}$", **kwargs)


class EndpointCreateInput(serializers.Serializer):
    url = serializers.URLField(max_length=2000)
    event_types = serializers.ListField(child=serializers.CharField(max_length=200), required=False,
                                        default=list, max_length=100)
    channels = serializers.ListField(child=_ChannelField(), required=False, default=list,
                                     max_length=MAX_CHANNELS)
    description = serializers.CharField(max_length=500, required=False, default="", allow_blank=True)

    def validate_event_types(self, value):
        return _validate_patterns(value)


class EndpointUpdateInput(EndpointCreateInput):
    url = serializers.URLField(max_length=2000, required=False)
    enabled = serializers.BooleanField(required=False)


class EndpointOutput(serializers.ModelSerializer):
    secret = serializers.SerializerMethodField()

    class Meta:
        model = Endpoint
        fields = ["id", "url", "description", "event_types", "channels", "enabled", "disabled_reason", "secret",
                  "created_at", "updated_at"]

    def get_secret(self, endpoint: Endpoint) -> str:
        current = getattr(endpoint, "current_secret", None)
        if current is not None:
            return current
        secrets = list(endpoint.secrets.all())  # prefetched, newest first
        return secrets[0].secret if secrets else ""


class EventCreateInput(serializers.Serializer):
    type = serializers.CharField(max_length=200)
    data = serializers.JSONField()
    channels = serializers.ListField(child=_ChannelField(), required=False, default=list, max_length=5)

    def validate_type(self, value: str) -> str:
        if not event_types.is_valid_type(value):
            raise serializers.ValidationError("Use dot-separated segments of [A-Za-z0-9_], e.g. invoice.paid.")
        return value


class DeliverySummaryOutput(serializers.Serializer):
    id = serializers.CharField()
    endpoint_id = serializers.CharField()
    status = serializers.ChoiceField(choices=[choice for choice, _ in Delivery.STATUSES])


class EventOutput(serializers.Serializer):
    """Plain fields rather than a ModelSerializer: this renders every 202 of the intake hot path."""

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


class DeliveryFilterInput(serializers.Serializer):
    status = serializers.ChoiceField(choices=[choice for choice, _ in Delivery.STATUSES], required=False)
    endpoint = serializers.CharField(required=False, max_length=40)
    event = serializers.CharField(required=False, max_length=40)


def _page(name: str, item_serializer) -> type[serializers.Serializer]:
    """The list envelope `{"data": [...], "next_cursor": ...}`, for the OpenAPI schema."""
    return type(name, (serializers.Serializer,), {
        "data": item_serializer(many=True),
        "next_cursor": serializers.CharField(allow_null=True),
    })


EndpointPageOutput = _page("EndpointPage", EndpointOutput)
EventPageOutput = _page("EventPage", EventOutput)
DeliveryPageOutput = _page("DeliveryPage", DeliveryOutput)


class EventFilterInput(serializers.Serializer):
    type = serializers.CharField(required=False, max_length=200)
