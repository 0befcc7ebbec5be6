"""Parked deliveries handed on: the calls of `herald_endpoint_hand_on` (webhooks/sql/endpoint_hand_on.sql).

A delivery its endpoint had no room for is parked by the claim (webhooks/delivery/claim.py). Someone
hands it on when room opens: the record of an attempt (a freed slot, webhooks/delivery/attempts.py), a
worker's engine when a throttled endpoint may start its next attempt (`endpoint_wake`), a change to the
endpoint (`endpoint_hand_on`), and beat (`beat_hand_on`: a tripped endpoint's probe, and the safety net
for an endpoint with nothing in flight). Each hands on at most HAND_ON_LIMIT at once.
"""
from django.db import connection, transaction

from webhooks.conf import herald_settings
from webhooks.delivery import db, deliveries, leases, outbox
from webhooks.delivery.publishing import deliveries_enqueue
from webhooks.models import Delivery, Endpoint

# The most parked deliveries of one endpoint sent on in one hand-on (an endpoint's cap can be up to 1000).
HAND_ON_LIMIT = 1000

_DELIVERY = Delivery._meta.db_table
_ENDPOINT = Endpoint._meta.db_table

# Parked deliveries of one endpoint go back into a queue, oldest first, as many as the endpoint has
# room for now (free slots, one for fifo, one if its throttle allows, none while tripped). The caller
# holds the endpoint's row lock, which every claim and record of that endpoint takes too, so the room
# cannot change underneath.
_HAND_ON_SQL = "SELECT unnest(herald_endpoint_hand_on(%(endpoint)s, %(default_cap)s, %(limit)s))"

# Beat: a tripped endpoint whose pause is over gets its probe: its oldest parked delivery goes back
# into a queue (a due retry of it would do as well; the first claim after next_probe_at is the probe).
_WAKE_PROBES_SQL = f"""
WITH ready AS (
    SELECT id FROM {_ENDPOINT}
     WHERE tripped_at IS NOT NULL AND next_probe_at <= now() AND enabled AND deleted_at IS NULL
       FOR NO KEY UPDATE SKIP LOCKED
), woken AS (
    {deliveries.unpark_oldest_of("ready")}
), published AS (
    {outbox.insert_published("woken")}
)
SELECT id FROM woken
"""

# Beat's safety net: an endpoint with parked deliveries and no attempt in flight has no one to hand
# them on (that takes a lost hand-on message *and* a lost lease); send up to its cap on. The endpoints
# with parked deliveries are found by skipping through the parked index, so a long parked backlog
# costs one index probe per endpoint, not one per delivery.
_SWEEP_SQL = f"""
WITH RECURSIVE parked(endpoint_id) AS (
    (SELECT endpoint_id FROM {_DELIVERY} WHERE parked_at IS NOT NULL ORDER BY endpoint_id LIMIT 1)
    UNION ALL
    SELECT (SELECT d.endpoint_id FROM {_DELIVERY} d
             WHERE d.parked_at IS NOT NULL AND d.endpoint_id > p.endpoint_id ORDER BY d.endpoint_id LIMIT 1)
      FROM parked p WHERE p.endpoint_id IS NOT NULL
), idle AS (
    SELECT ep.id FROM {_ENDPOINT} ep JOIN parked p ON p.endpoint_id = ep.id
     WHERE ep.tripped_at IS NULL AND ep.enabled AND ep.deleted_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM {leases.TABLE} l WHERE l.endpoint_id = ep.id AND l.until > now())
       FOR NO KEY UPDATE OF ep SKIP LOCKED
)
SELECT unnest(herald_endpoint_hand_on(idle.id, %(default_cap)s, %(limit)s)) FROM idle
"""

# A worker's engine wakes a throttled endpoint when its next attempt may start: under the endpoint's
# lock, the oldest parked delivery (if any) is handed on.
_WAKE_SQL = f"""
SELECT unnest(herald_endpoint_hand_on(ep.id, %(default_cap)s, %(limit)s))
  FROM (SELECT id FROM {_ENDPOINT} WHERE id = %(endpoint)s FOR NO KEY UPDATE) ep
"""


def endpoint_wake(*, endpoint_id: str) -> list[str]:
    """Hand a throttled endpoint's parked deliveries on, as many as it may start now (see _WAKE_SQL)."""
    return [row[0] for row in db.call(_WAKE_SQL, db.endpoint_params(endpoint=endpoint_id, limit=HAND_ON_LIMIT))]


def endpoint_hand_on(*, endpoint: Endpoint) -> list[str]:
    """Send an endpoint's parked deliveries on, as many as it has room for now; in a transaction that
    holds the endpoint's row lock. A tripped or disabled endpoint hands nothing on."""
    with connection.cursor() as cursor:
        cursor.execute(_HAND_ON_SQL, db.endpoint_params(endpoint=endpoint.pk, limit=HAND_ON_LIMIT))
        ids = [row[0] for row in cursor.fetchall()]
    if ids:
        transaction.on_commit(lambda: deliveries_enqueue(delivery_ids=ids,
                                                         queue=herald_settings.queues.retries), robust=True)
    return ids


def beat_hand_on() -> list[str]:
    """Beat: the probes of tripped endpoints whose pause is over, and the parked deliveries of endpoints with
    nothing in flight (see _WAKE_PROBES_SQL, _SWEEP_SQL); the ids to publish now, to the retry queue."""
    with connection.cursor() as cursor:
        cursor.execute(_WAKE_PROBES_SQL)
        woken = [row[0] for row in cursor.fetchall()]
        cursor.execute(_SWEEP_SQL, db.endpoint_params(limit=HAND_ON_LIMIT))
        woken += [row[0] for row in cursor.fetchall()]
    return woken
