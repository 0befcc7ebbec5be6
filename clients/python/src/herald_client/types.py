"""The shapes of Herald's JSON answers, as TypedDicts: plain dicts at run time, checked by mypy.

Herald may add fields to an answer in a later version; they are present in the dict even when not
listed here. Timestamps are ISO 8601 strings in UTC, ids prefixed strings (`ep_…`, `evt_…`).
"""
from __future__ import annotations

from typing import Any, Literal, TypedDict

DeliveryStatus = Literal["pending", "succeeded", "failed", "cancelled"]
Ordering = Literal["unordered", "fifo"]
Signature = Literal["v1", "v1a"]
EndpointKind = Literal["http", "poll", "amqp", "redis_stream", "nats"]


class EndpointHealth(TypedDict):
    state: Literal["healthy", "tripped", "disabled"]
    consecutive_failures: int
    failing_since: str | None
    next_probe_at: str | None


class EndpointAuth(TypedDict, total=False):
    """An endpoint's auth as Herald shows it: never the password, token or client secret."""
    type: Literal["basic", "bearer", "oauth2_client_credentials"]
    username: str
    token_url: str
    client_id: str
    scope: str | None
    audience: str | None


class EndpointCertificate(TypedDict):
    subject: str
    expires_at: str


class BrokerFields(TypedDict, total=False):
    """A message broker endpoint's fields (kinds amqp, redis_stream, nats), shown beside its `url` (which
    never carries its credentials)."""
    exchange: str
    routing_key: str
    stream: str
    maxlen: int | None
    subject: str


class Endpoint(BrokerFields):
    """An endpoint; never its signing secret (`endpoints.secret(id)` reads that), header values or auth
    secrets. A poll endpoint has no `url`: its consumer reads its messages (`endpoints.messages`)."""
    id: str
    kind: EndpointKind
    url: str | None
    description: str
    event_types: list[str]
    channels: list[str]
    enabled: bool
    disabled_reason: str
    max_in_flight: int
    throttle_rate: int | None
    ordering: Ordering
    signature: Signature
    filter: dict[str, Any] | None
    header_names: list[str]
    auth: EndpointAuth | None
    client_certificate: EndpointCertificate | None
    health: EndpointHealth
    created_at: str
    updated_at: str


class Message(TypedDict):
    """A poll endpoint's message: the headers and body (byte for byte, as UTF-8) a POST would carry."""
    delivery_id: str
    headers: dict[str, str]
    body: str


class MessagePage(TypedDict):
    data: list[Message]
    next_cursor: str


class DeliverySummary(TypedDict):
    id: str
    endpoint_id: str
    status: DeliveryStatus


class Event(TypedDict):
    """An event with the current status of each delivery it fanned out to."""
    id: str
    type: str
    data: Any
    channels: list[str]
    created_at: str
    deliveries: list[DeliverySummary]


class Attempt(TypedDict):
    number: int
    started_at: str
    duration_ms: int | None
    response_status: int | None
    response_body: str
    error: str


class Delivery(TypedDict):
    id: str
    event_id: str
    endpoint_id: str
    status: DeliveryStatus
    attempt_count: int
    next_attempt_at: str | None
    created_at: str
    updated_at: str


class DeliveryDetail(Delivery):
    """A delivery with every attempt it made (`deliveries.get`)."""
    attempts: list[Attempt]


class Recovery(TypedDict):
    """A resend of an endpoint's failed deliveries in a time range (`endpoints.recover`); `status` is
    `running`, then `completed`; `done` of `total` sent again so far."""
    id: str
    endpoint_id: str
    since: str
    until: str | None
    status: str
    total: int
    done: int
    created_at: str
    completed_at: str | None


class PortalLink(TypedDict):
    """A one-time link to the tenant's portal: open it once, before `expires_at`."""
    url: str
    expires_at: str


class Tenant(TypedDict):
    """One of the platform's customers (platform credential only)."""
    id: str
    uid: str | None
    name: str
    max_endpoints: int | None
    delivery_weight: int
    metadata: dict[str, Any]
    created_at: str


class EventType(TypedDict):
    """An entry of the deployment's event-type catalog: `schema` (JSON Schema, draft 2020-12) is what intake
    checks an event's `data` against."""
    id: str
    name: str
    description: str
    schema: dict[str, Any] | None
    example: Any
    created_at: str
    updated_at: str


class Credential(TypedDict):
    """A tenant credential just made: `token` is shown this once; keep it."""
    id: str
    token: str
    created_at: str


class WebhookPayload(TypedDict):
    """The body of every webhook Herald sends (the event id is the `webhook-id` header)."""
    type: str
    timestamp: str
    data: Any
