"""Polling endpoints (SPEC §12): a poll endpoint's messages served to its consumer in order, and
acknowledged by cursor.

Herald never connects anywhere for a poll endpoint: intake gives its deliveries no outbox row and no
`next_attempt_at` (webhooks/delivery/deliveries.py's insert, in the fan-out), so no relay publishes them and the claim never takes
them. Its consumer reads them with `GET /api/v1/endpoints/{id}/messages?after=&limit=&wait=`.

The cursor is a number in the order the endpoint's deliveries are *served*, given to a delivery the first
time it is served (`poll_seq`), under the endpoint's row lock. Not the delivery id: ids follow the events'
ULIDs, made before their transactions commit, so an event committed a moment late can have a smaller id
than one already served; acknowledging "every id up to C" would then succeed a message nobody read. A
number given at serving time is never behind one already given, so `after=C` acknowledges exactly the
messages served up to C. What an acknowledgement records is what an attempt that got a 2xx records:
the delivery becomes `succeeded` with one attempt more (no HTTP status: nothing was sent), and the attempt
counts in /metrics as a success.
"""
import logging
from dataclasses import dataclass

from django.db import connection, transaction
from django.db.models import Q
from django.db.models.functions import Now

from webhooks import crypto
from webhooks.delivery import attempts, deliveries, metrics
from webhooks.delivery.sending import message_headers
from webhooks.models import Delivery, Endpoint, EndpointSecret, Event

logger = logging.getLogger("herald.polling")

MAX_LIMIT = 100
# Cursors are plain numbers; past this, one is refused (a new number is the greater of the endpoint's
# last one and the cursor read with, which must stay far from bigint's end).
MAX_CURSOR = 2**62

_DELIVERY = Delivery._meta.db_table

# Every served delivery up to the cursor that is still pending is acknowledged: succeeded, with an attempt.
_ACK_SQL = f"""
WITH acked AS (
    {deliveries.acknowledge_served()}
), attempts AS (
    {attempts.insert_acknowledged("acked")}
)
SELECT count(*) FROM acked
"""

# Pending deliveries never served yet get the next numbers, oldest event first, as many as a page holds.
_NUMBER_SQL = deliveries.number_unserved()

_PAGE_SQL = f"""
SELECT d.id, d.poll_seq, e.id, e.payload
  FROM {_DELIVERY} d JOIN {Event._meta.db_table} e ON e.id = d.event_id
 WHERE d.endpoint_id = %(endpoint)s AND d.status = '{Delivery.PENDING}' AND d.poll_seq > %(after)s
 ORDER BY d.poll_seq
 LIMIT %(limit)s
"""


@dataclass(frozen=True)
class Message:
    delivery_id: str
    headers: dict[str, str]
    body: str


@dataclass(frozen=True)
class MessagePage:
    messages: list[Message]
    next_cursor: str
    acknowledged: int


def endpoint_messages(*, endpoint: Endpoint, after: int, limit: int) -> MessagePage:
    """Acknowledge the endpoint's messages served up to cursor `after`, then serve the next `limit`
    (pending, in the order they were first served, which is event order) with the headers and body an
    attempt would send now. `next_cursor` is the last one's number, or `after` when there is none."""
    assert endpoint.kind == Endpoint.POLL and 0 <= after <= MAX_CURSOR and 1 <= limit <= MAX_LIMIT
    params = {"endpoint": endpoint.pk, "after": after, "limit": limit}
    with transaction.atomic(), connection.cursor() as cursor:
        # Serves one reader of the endpoint at a time, so that two never number the same deliveries.
        # Intake's inserts of its deliveries do not wait for it (their foreign-key check takes KEY SHARE).
        cursor.execute(f"SELECT 1 FROM {Endpoint._meta.db_table} WHERE id = %(endpoint)s FOR NO KEY UPDATE", params)
        cursor.execute(_ACK_SQL, params)
        acknowledged = cursor.fetchone()[0]
        cursor.execute(_NUMBER_SQL, params)
        cursor.execute(_PAGE_SQL, params)
        rows = cursor.fetchall()
        secrets = _active_secrets(endpoint) if rows else []
    if acknowledged:
        metrics.delivery_attempts.labels("success", metrics.HEALTHY).inc(acknowledged)
        logger.info("delivery.acknowledged", extra={"endpoint_id": endpoint.pk, "count": acknowledged,
                                                    "cursor": after})
    messages = [Message(delivery_id=delivery_id, body=bytes(payload).decode("utf-8"),
                        headers=message_headers(secrets=secrets, event_id=event_id, payload=bytes(payload)))
                for delivery_id, _, event_id, payload in rows]
    return MessagePage(messages=messages, next_cursor=str(rows[-1][1] if rows else after), acknowledged=acknowledged)


def _active_secrets(endpoint: Endpoint) -> list[str]:
    """Every secret that signs now, newest first: as the claim reads them for an attempt (migration 0009)."""
    rows = EndpointSecret.objects.filter(endpoint=endpoint).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=Now())).order_by("-created_at", "-id")
    return [crypto.decrypt(secret.encrypted_secret) for secret in rows]
