"""Event intake: record the event, fan it out to matching endpoints, ring the relays' doorbell after commit."""
import json
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.db import connection, transaction
from django.utils import timezone

from webhooks import event_schemas, event_types, ids, tracing
from webhooks.delivery import outbox
from webhooks.delivery.publishing import poll_notify, publisher
from webhooks.event_types import is_reserved, matching_patterns
from webhooks.logcontext import request_id
from webhooks.models import Delivery, Endpoint, Event, EventType, Tenant
from webhooks.payload import build_payload

# One round trip for the whole fan-out: insert the event, match the tenant's enabled endpoints
# (`event_types` empty or overlapping the type's patterns; `channels` empty or overlapping the
# event's), and insert one pending delivery for each. Delivery ids extend the event's ULID with the
# endpoint's rank, so they stay unique and time-ordered (by the event's ULID first) without a round trip
# per id; each gets its outbox row, due now and unpublished. The rank is padded to five digits and never
# cut (lpad cuts to the length it is given: rank 100000 became 10000 again), so a five-digit rank and a
# longer one never meet, and ranks up to 10^10 fit the 40-character id. An operational event (`herald.…`, SPEC §8) goes only to
# endpoints whose `event_types` name it, whatever their channels; a test event (herald.test) only to the
# endpoint it was sent to.
#
# A poll endpoint's delivery (SPEC §12) gets no outbox row and no next_attempt_at: no relay publishes it
# and the claim, which takes only a due delivery, never sends it; its consumer reads it
# (webhooks/services/polling.py), woken by a NOTIFY on commit.
# The catalog entry of the event's type comes back as one more row (id NULL): its schema digest when it
# has a schema, and the schema itself only when this process holds no validator of that digest
# (webhooks/event_schemas.py). The data is checked after the statement, in the same transaction; an
# event that does not match raises EventDataInvalid, and the caller's transaction rolls the insert back
# (the API's 400 does): no extra round trip for the check, and a changed schema is seen at once.
#
# The two lists travel as JSON arrays, turned into arrays by PostgreSQL: psycopg's Python list adapter
# cost about 5 % of an intake request's CPU.
_INGEST_SQL = f"""
WITH lists AS (
    SELECT ARRAY(SELECT jsonb_array_elements_text(%(channels)s::jsonb))::varchar[] AS channels,
           ARRAY(SELECT jsonb_array_elements_text(%(patterns)s::jsonb))::varchar[] AS patterns
), event AS (
    INSERT INTO {Event._meta.db_table} (id, tenant_id, type, channels, payload, request_id, traceparent, created_at)
    SELECT %(event_id)s, %(tenant)s, %(type)s, lists.channels, %(payload)s, %(request_id)s, %(traceparent)s, %(now)s
      FROM lists
    RETURNING id
), matched AS (
    SELECT e.id, e.kind, row_number() OVER (ORDER BY e.id) AS rank
      FROM {Endpoint._meta.db_table} e, lists
     WHERE e.tenant_id = %(tenant)s AND e.enabled AND e.deleted_at IS NULL
       AND CASE WHEN %(only)s::varchar IS NOT NULL THEN e.id = %(only)s
                ELSE ((e.event_types = '{{}}' AND NOT %(reserved)s) OR e.event_types && lists.patterns)
                     AND (e.channels = '{{}}' OR e.channels && lists.channels OR %(reserved)s) END
), deliveries AS (
    INSERT INTO {Delivery._meta.db_table}
        (id, tenant_id, event_id, endpoint_id, status, attempt_count, next_attempt_at, created_at, updated_at)
    SELECT %(delivery_prefix)s || lpad(rank::text, greatest(5, length(rank::text)), '0'), %(tenant)s, (SELECT id FROM event), matched.id,
           'pending', 0, CASE WHEN matched.kind = '{Endpoint.POLL}' THEN NULL ELSE %(now)s END, %(now)s, %(now)s
      FROM matched
    RETURNING id, endpoint_id, next_attempt_at IS NULL AS polled
), outbox AS (
    {outbox.insert_new("deliveries WHERE NOT polled", due="%(now)s")}
)
SELECT id, endpoint_id, polled, NULL::varchar, NULL::jsonb FROM deliveries
UNION ALL
SELECT NULL, NULL, NULL::boolean, schema_digest, CASE WHEN schema_digest IS DISTINCT FROM %(known_digest)s THEN schema END
  FROM {EventType._meta.db_table} WHERE name = %(type)s AND schema_digest IS NOT NULL
"""


class EventDataInvalid(Exception):
    """The event's `data` does not match its type's schema; `errors` maps JSON pointers (`/data/amount`)
    to messages. The event was inserted: the caller's transaction must roll back (the API's 400 does)."""

    def __init__(self, errors: dict[str, list[str]]):
        super().__init__(errors)
        self.errors = errors


def event_ingest(*, tenant: Tenant, event_type: str, data: Any, channels: list[str],
                 now: datetime | None = None, only_endpoint_id: str | None = None) -> Event:
    """Create the event and one pending delivery per matching endpoint in the caller's transaction.

    When the type's catalog entry has a schema and `data` does not match it, raise EventDataInvalid.

    Each delivery gets its outbox row, due now and not yet published. Once the transaction
    commits, the relays' doorbell rings (from a background thread: the request does not wait), and a
    worker's relay publishes their tasks (webhooks/delivery/relay.py); without a doorbell, the relays' own
    polling and beat's dispatcher find them.
    """
    created_at = now or timezone.now()
    event = Event(id=ids.event_id(), tenant_id=tenant.pk, type=event_type, channels=channels,
                  created_at=created_at, request_id=request_id.get(),
                  traceparent=tracing.current_traceparent() if tracing.ENABLED else None,
                  payload=build_payload(event_type=event_type, created_at=created_at, data=data))
    event.__dict__["_data"] = data  # Event.data, without parsing the body just built
    with connection.cursor() as cursor:
        cursor.execute(_INGEST_SQL, {
            "event_id": event.id, "tenant": tenant.pk, "type": event_type,
            "channels": json.dumps(channels), "payload": event.payload, "request_id": event.request_id,
            "traceparent": event.traceparent, "now": created_at, "patterns": json.dumps(matching_patterns(event_type)),
            "reserved": is_reserved(event_type), "only": only_endpoint_id,
            "delivery_prefix": "dlv_" + event.id.removeprefix("evt_"),
            "known_digest": event_schemas.known_digest(event_type),
        })
        rows = cursor.fetchall()
    catalog = next((row for row in rows if row[0] is None), None)
    if catalog is not None:
        rows.remove(catalog)
        _, _, _, digest, schema = catalog
        errors = event_schemas.instance_errors(event_schemas.type_validator(event_type, digest, schema), data,
                                               pointer="/data")
        if errors:
            raise EventDataInvalid(errors)
    event._state.adding = False
    event.delivery_list = [Delivery(id=delivery_id, tenant_id=tenant.pk, event=event, endpoint_id=endpoint_id,
                                    status=Delivery.PENDING, next_attempt_at=None if polled else created_at)
                           for delivery_id, endpoint_id, polled, _, _ in rows]
    if any(not polled for _, _, polled, _, _ in rows):
        transaction.on_commit(publisher.ring, robust=True)
    polled = [endpoint_id for _, endpoint_id, polled, _, _ in rows if polled]
    if polled:
        poll_notify(endpoint_ids=polled)
    return event


def event_emit_operational(*, tenant_id: str, event_type: str, data: dict[str, Any]) -> Event:
    """Record one of Herald's own events (SPEC §8) for the tenant, in the caller's transaction. An endpoint
    URL in it goes without any `user:password@` (URLs carrying them are refused now, but an endpoint made
    before may still have one): these events go to the tenant's other receivers."""
    assert is_reserved(event_type), event_type
    if isinstance(data.get("url"), str):
        data = {**data, "url": _without_credentials(data["url"])}
    return event_ingest(tenant=Tenant(pk=tenant_id), event_type=event_type, data=data, channels=[])


def event_send_test(*, endpoint: Endpoint) -> Event:
    """A `herald.test` event to this endpoint only (SPEC §8), in the caller's transaction; it is delivered
    like any event (an enabled endpoint only)."""
    return event_ingest(tenant=Tenant(pk=endpoint.tenant_id), event_type=event_types.TEST,
                        data={"endpoint_id": endpoint.pk, "message": "A test event sent from Herald."},
                        channels=[], only_endpoint_id=endpoint.pk)


def _without_credentials(url: str) -> str:
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
