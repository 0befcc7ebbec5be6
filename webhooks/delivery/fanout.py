"""The fan-out: an event and its deliveries inserted (the one writer of their rows at intake), the relays'
doorbell rung after commit.

The owner of these inserts (events, deliveries and their outbox rows, in one statement) and of the rule that
matches an event to endpoints (`_matches`); the intake's fast path runs the same statement inside its PL/pgSQL
function (FAST_PATH_FANOUT, rendered into webhooks/sql/event_intake.sql). The services above call it: intake's
events (webhooks/services/events.py), a test event, and Herald's own operational events, which the record of
an attempt (webhooks/delivery/record.py) and an endpoint disabled (webhooks/delivery/endpoints.py) emit from
inside the delivery package.
"""
import json
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.db import connection, transaction
from django.utils import timezone

from webhooks import event_schemas, event_types, ids, tracing
from webhooks.delivery import deliveries, outbox
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
# A poll endpoint's delivery (SPEC §12; a kind that is not `pushed`, webhooks/delivery/destinations/) gets no outbox row and no next_attempt_at: no relay publishes it
# and the claim, which takes only a due delivery, never sends it; its consumer reads it
# (webhooks/services/polling.py), woken by a NOTIFY on commit.
# The catalog entry of the event's type comes back as one more row (id NULL): its schema digest when it
# has a schema, and the schema itself only when this process holds no validator of that digest
# (webhooks/event_schemas.py). The data is checked after the statement, in the same transaction; an
# event that does not match raises EventDataInvalid, and the caller's transaction rolls the insert back
# (the API's 400 does): no extra round trip for the check, and a changed schema is seen at once.
#
# An endpoint's payload filter (SPEC §15, webhooks/filters.py) is a jsonpath predicate compiled when it was
# written, matched here against the event's {type, data, channels}. The document is built by an uncorrelated
# subquery (an InitPlan, run only when first needed, from the row just inserted rather than from a parameter
# the planner would parse up front): an event none of whose endpoints has a filter never parses its payload.
# A filter that cannot decide (jsonpath's unknown) does not match. A test event goes to its endpoint whatever
# its filter.
#
# The two lists travel as JSON arrays, turned into arrays by PostgreSQL: psycopg's Python list adapter
# cost about 5 % of an intake request's CPU.
def _matches(*, patterns: str, channels: str, document: str, reserved: str = "false") -> str:
    """The matching rule, the one copy of it: a condition on the endpoint `e` for an event whose matching
    patterns and channels are the arrays `patterns` and `channels` and whose `{type, channels, data}` is
    `document` (evaluated only for an endpoint with a filter). `reserved`: whether the type is one of Herald's
    own (then only the endpoints that name it, whatever their channels)."""
    return f"""((e.event_types = '{{}}' AND NOT {reserved}) OR e.event_types && {patterns})
       AND (e.channels = '{{}}' OR e.channels && {channels} OR {reserved})
       AND (e.filter_path IS NULL OR coalesce({document} @@ e.filter_path, false))"""


def single_event(*, event_id: str, tenant: str, type_: str, channels: str, patterns: str, payload: str,
                 request_id: str, traceparent: str, now: str, delivery_prefix: str, reserved: str = "false",
                 only: str = "NULL::varchar") -> str:
    """The fan-out of one event, as the CTEs `lists`, `event`, `matched`, `deliveries` (RETURNING id,
    endpoint_id, polled) and `outbox`, each argument an SQL expression. Two statements are made of it:
    `_INGEST_SQL` below (expressions: query parameters) and the intake's fast path, herald_event_intake
    (webhooks/sql/event_intake.sql's `{{single_event}}`, expressions: the function's arguments, with no
    reserved type and no `only`), so the fast path inserts what this module would."""
    document = f"""(SELECT jsonb_build_object('type', {type_}::text, 'channels', {channels}::jsonb,
                                           'data', convert_from(payload, 'UTF8')::jsonb -> 'data')
                   FROM event)"""
    return f"""WITH lists AS (
    SELECT ARRAY(SELECT jsonb_array_elements_text({channels}::jsonb))::varchar[] AS channels,
           ARRAY(SELECT jsonb_array_elements_text({patterns}::jsonb))::varchar[] AS patterns
), event AS (
    INSERT INTO {Event._meta.db_table} (id, tenant_id, type, channels, payload, request_id, traceparent, created_at)
    SELECT {event_id}, {tenant}, {type_}, lists.channels, {payload}, {request_id}, {traceparent}, {now}
      FROM lists
    RETURNING id, payload
), matched AS (
    SELECT e.id, e.kind, row_number() OVER (ORDER BY e.id) AS rank
      FROM {Endpoint._meta.db_table} e, lists
     WHERE e.tenant_id = {tenant} AND e.enabled AND e.deleted_at IS NULL
       AND CASE WHEN {only} IS NOT NULL THEN e.id = {only}
                ELSE {_matches(patterns="lists.patterns", channels="lists.channels", document=document,
                               reserved=reserved)} END
), deliveries AS (
    {deliveries.insert_matched("matched", tenant=tenant, now=now, event_sql="(SELECT id FROM event)",
                               id_sql=f"{delivery_prefix} || lpad(rank::text, greatest(5, length(rank::text)), '0')")}
    RETURNING id, endpoint_id, next_attempt_at IS NULL AS polled
), outbox AS (
    {outbox.insert_new("deliveries WHERE NOT polled", due=now, tenant=tenant)}
)"""


_INGEST_SQL = single_event(
    event_id="%(event_id)s", tenant="%(tenant)s", type_="%(type)s", channels="%(channels)s",
    patterns="%(patterns)s", payload="%(payload)s", request_id="%(request_id)s", traceparent="%(traceparent)s",
    now="%(now)s", delivery_prefix="%(delivery_prefix)s", reserved="%(reserved)s", only="%(only)s::varchar",
) + f"""
SELECT id, endpoint_id, polled, NULL::varchar, NULL::jsonb FROM deliveries
UNION ALL
SELECT NULL, NULL, NULL::boolean, schema_digest, CASE WHEN schema_digest IS DISTINCT FROM %(known_digest)s THEN schema END
  FROM {EventType._meta.db_table} WHERE name = %(type)s AND schema_digest IS NOT NULL
"""


# The fast path's fan-out (herald_event_intake, webhooks/sql/event_intake.sql, where `{{single_event}}` stands
# for it; webhooks/sql/__init__.py renders it): the same CTEs, on that function's arguments. An event of the
# tenant's own only (the fast path takes no reserved type and no test event); no traceparent (the fast path
# runs with tracing off).
FAST_PATH_FANOUT = single_event(
    event_id="p_event_id", tenant="p_tenant", type_="p_type", channels="p_channels", patterns="p_patterns",
    payload="p_payload", request_id="p_request_id", traceparent="NULL", now="p_now",
    delivery_prefix="'dlv_' || substr(p_event_id, 5)")


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


# The batch intake's statement (SPEC §4 `POST /events/batch`): the single statement above for many events
# at once, still one round trip. The events travel as parallel arrays (unnest keeps them in step); each
# event's channels and matching patterns as one JSON array each. Each event's endpoints are ranked on
# their own, so every delivery id is the one a single POST would have given it. A batch never holds
# Herald's own types (the API refuses them), nor a test event: no `reserved` or `only` cases here. Endpoints'
# filters are matched as in the single statement, against each event's `{type, channels, data}`.
_INGEST_MANY_SQL = f"""
WITH input AS (
    SELECT * FROM unnest(%(ids)s::varchar[], %(types)s::varchar[], %(payloads)s::bytea[],
                         %(channels)s::jsonb[], %(patterns)s::jsonb[]) AS x(id, type, payload, channels, patterns)
), lists AS (
    SELECT id, type, payload,
           ARRAY(SELECT jsonb_array_elements_text(channels))::varchar[] AS channels,
           ARRAY(SELECT jsonb_array_elements_text(patterns))::varchar[] AS patterns
      FROM input
), event AS (
    INSERT INTO {Event._meta.db_table} (id, tenant_id, type, channels, payload, request_id, traceparent, created_at)
    SELECT id, %(tenant)s, type, channels, payload, %(request_id)s, %(traceparent)s, %(now)s FROM lists
), matched AS (
    SELECT l.id AS event_id, e.id, e.kind, row_number() OVER (PARTITION BY l.id ORDER BY e.id) AS rank
      FROM lists l
      JOIN {Endpoint._meta.db_table} e
        ON e.tenant_id = %(tenant)s AND e.enabled AND e.deleted_at IS NULL
       AND {_matches(patterns="l.patterns", channels="l.channels", document='''jsonb_build_object(
              'type', l.type::text, 'channels', to_jsonb(l.channels),
              'data', convert_from(l.payload, 'UTF8')::jsonb -> 'data')''')}
), deliveries AS (
    {deliveries.insert_matched("matched", tenant="%(tenant)s", now="%(now)s", event_sql="event_id",
                               id_sql="'dlv_' || substr(event_id, 5) || lpad(rank::text, greatest(5, length(rank::text)), '0')")}
    RETURNING id, event_id, endpoint_id, next_attempt_at IS NULL AS polled
), outbox AS (
    {outbox.insert_new("deliveries WHERE NOT polled", due="%(now)s", tenant="%(tenant)s")}
)
SELECT id, event_id, endpoint_id, polled, NULL::varchar, NULL::jsonb FROM deliveries
UNION ALL
SELECT NULL, name, NULL, NULL::boolean, schema_digest,
       CASE WHEN schema_digest IS DISTINCT FROM (%(known_digests)s::jsonb ->> name) THEN schema END
  FROM {EventType._meta.db_table} WHERE name = ANY(%(types)s::varchar[]) AND schema_digest IS NOT NULL
"""


def event_ingest_many(*, tenant: Tenant, events: list[dict[str, Any]], now: datetime | None = None) -> list[Event]:
    """Create every event of `events` (`{type, data, channels}` each, validated, none of Herald's own
    types) and their deliveries in the caller's transaction, in one statement; return them in order.

    All or nothing: when an event's data does not match its type's schema, raise EventDataInvalid with
    every such error keyed by `/events/{i}/data/…`; the caller's transaction rolls every insert back.
    The relays' doorbell rings once after commit, whatever the number of events.
    """
    created_at = now or timezone.now()
    rid = request_id.get()
    traceparent = tracing.current_traceparent() if tracing.ENABLED else None
    made: list[Event] = []
    for item in events:
        event_type = item["type"]
        assert not is_reserved(event_type), event_type
        event = Event(id=ids.event_id(), tenant_id=tenant.pk, type=event_type, channels=item["channels"],
                      created_at=created_at, request_id=rid, traceparent=traceparent,
                      payload=build_payload(event_type=event_type, created_at=created_at, data=item["data"]))
        event.__dict__["_data"] = item["data"]
        made.append(event)
    types = sorted({event.type for event in made})
    with connection.cursor() as cursor:
        cursor.execute(_INGEST_MANY_SQL, {
            "ids": [event.id for event in made],
            "types": [event.type for event in made],
            "payloads": [event.payload for event in made],
            "channels": [json.dumps(event.channels) for event in made],
            "patterns": [json.dumps(matching_patterns(event.type)) for event in made],
            "tenant": tenant.pk, "request_id": rid, "traceparent": traceparent, "now": created_at,
            "known_digests": json.dumps({name: event_schemas.known_digest(name) for name in types}),
        })
        rows = cursor.fetchall()
    validators = {name: event_schemas.type_validator(name, digest, schema)
                  for delivery_id, name, _, _, digest, schema in rows if delivery_id is None}
    errors: dict[str, list[str]] = {}
    for index, event in enumerate(made):
        validator = validators.get(event.type)
        if validator is not None:
            errors.update(event_schemas.instance_errors(validator, event.data, pointer=f"/events/{index}/data"))
    if errors:
        raise EventDataInvalid(errors)
    deliveries: dict[str, list[Delivery]] = {event.id: [] for event in made}
    by_id = {event.id: event for event in made}
    published = False
    polled_endpoints = []
    for delivery_id, event_id, endpoint_id, polled, _, _ in sorted(row for row in rows if row[0] is not None):
        deliveries[event_id].append(Delivery(
            id=delivery_id, tenant_id=tenant.pk, event=by_id[event_id], endpoint_id=endpoint_id,
            status=Delivery.PENDING, next_attempt_at=None if polled else created_at))
        if polled:
            polled_endpoints.append(endpoint_id)
        else:
            published = True
    for event in made:
        event._state.adding = False
        event.delivery_list = deliveries[event.id]
    if published:
        transaction.on_commit(publisher.ring, robust=True)
    if polled_endpoints:
        poll_notify(endpoint_ids=sorted(set(polled_endpoints)))
    return made


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
