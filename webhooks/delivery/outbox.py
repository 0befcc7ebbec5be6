"""The outbox (DeliveryOutbox): every write of its rows from Python is here, whole or as a part of a statement.

A delivery that needs a message has a row: written due and unpublished by intake (`insert_new`, in
the fan-out's statement) and by a manual retry (`insert_due`), marked published by a relay
(`MARK_DUE_SQL`; `unmark` if the broker did not take the messages), published again by beat's
dispatcher when its message was lost (`LOST_SQL`), written published by a probe's wake-up
(`insert_published`), dropped when its delivery is finished (`drop_finished`, `delete_of`).

The PostgreSQL functions write it too (webhooks/sql/): the claim deletes a delivery's row (its message
has arrived), the record writes a retry's row due at its time, the hand-on writes a handed-on
delivery's row published now.

`periodic` says which queue the row's message goes (or went) to: the retry queue (HERALD_PERIODIC_QUEUE:
retries, hand-ons, re-publications) or the main one (first attempts).
"""
from django.db import connection

from webhooks.delivery import leases
from webhooks.models import Delivery, DeliveryOutbox

TABLE = DeliveryOutbox._meta.db_table
_DELIVERY = Delivery._meta.db_table


def insert_new(source: str, *, due: str) -> str:
    """A part of a statement (a CTE's INSERT): the first attempts of new deliveries, `SELECT id, ... FROM
    {source}`, due at `due` and unpublished, for the main queue (a relay publishes them)."""
    return f"""INSERT INTO {TABLE} (delivery_id, due_at, published_at, periodic)
    SELECT id, {due}, NULL, false FROM {source}"""


def insert_due(source: str, *, due: str) -> str:
    """A part of a statement: rows due at `due` and unpublished, for the retry queue, replacing any row the
    deliveries of `source` have (a relay publishes them)."""
    return f"""INSERT INTO {TABLE} AS o (delivery_id, due_at, published_at, periodic)
    SELECT id, {due}, NULL, true FROM {source}
    ON CONFLICT (delivery_id) DO UPDATE SET due_at = excluded.due_at, published_at = NULL, periodic = true"""


def insert_published(source: str) -> str:
    """A part of a statement: rows of deliveries the caller publishes now itself (to the retry queue), so that
    the dispatcher publishes one again if that message is lost."""
    return f"""INSERT INTO {TABLE} AS o (delivery_id, due_at, published_at, periodic)
    SELECT id, now(), now(), true FROM {source}
    ON CONFLICT (delivery_id) DO UPDATE SET published_at = now(), periodic = true"""


def delete_of(deliveries: str) -> str:
    """A part of a statement: the rows of the deliveries `deliveries` (a SELECT of ids) go; RETURNING 1 each."""
    return f"DELETE FROM {TABLE} o WHERE o.delivery_id IN ({deliveries}) RETURNING 1"


def drop_finished(*, endpoint_id: str) -> None:
    """The rows of the endpoint's deliveries that are no longer pending have nothing to publish."""
    DeliveryOutbox.objects.filter(delivery__endpoint_id=endpoint_id).exclude(
        delivery__status=Delivery.PENDING).delete()


# The relay's step: outbox_due holds exactly the unpublished rows, due ones first. One whose delivery a
# worker holds (a live lease) is that worker's. The ids go through an array so that the outer UPDATE
# finds each row by its key (an IN over the subquery was planned as a hash join over the whole table
# once the batch grew).
MARK_DUE_SQL = f"""
UPDATE {TABLE} o SET published_at = now()
 WHERE o.delivery_id = ANY(ARRAY(
        SELECT q.delivery_id FROM {TABLE} q
         WHERE q.published_at IS NULL AND q.due_at <= now()
           AND NOT EXISTS (SELECT 1 FROM {leases.TABLE} l
                            WHERE l.delivery_id = q.delivery_id AND l.until > now())
         ORDER BY q.due_at
         LIMIT %(batch)s
           FOR UPDATE SKIP LOCKED))
RETURNING o.delivery_id, o.periodic, o.published_at
"""

_UNMARK_SQL = f"""
UPDATE {TABLE} o SET published_at = NULL
  FROM unnest(%(ids)s::text[], %(marks)s::timestamptz[]) AS m(delivery_id, published_at)
 WHERE o.delivery_id = m.delivery_id AND o.published_at = m.published_at
"""


def unmark(ids: list[str], marks: list) -> None:
    """Make rows whose messages never reached the broker due again (those a worker already claimed, or
    another relay marked since, are left alone)."""
    with connection.cursor() as cursor:
        cursor.execute(_UNMARK_SQL, {"ids": ids, "marks": marks})


# Besides the relay's step (the outbox's due, unpublished rows: new deliveries and retries that have
# come due), beat's dispatcher publishes again, each found by an index range scan that touches only
# rows it will publish (a million retries scheduled for later, or a long backlog waiting in a queue,
# cost nothing):
# - deliveries whose message was lost: published before their queue's cutoff and never claimed (a
#   claim deletes the outbox row; outbox_published). The cutoff comes from the queue's progress
#   (webhooks/progress.py): queues are first in, first out, so what was published well before the
#   newest message the workers consumed is no longer in the queue; an empty queue holds nothing, so
#   anything published before WEBHOOK_REDISPATCH_AFTER_SECONDS ago is lost (flush, restart, a worker
#   killed with messages taken). The row's `periodic` says which queue its message went to; whatever
#   the dispatcher publishes again goes to the retry queue;
# - deliveries claimed by a worker that died (their lease ran out with no record; the claim had
#   deleted their outbox row, so they get one again).
# A parked delivery is in no queue and not the dispatcher's business: its endpoint hands it on.
LOST_SQL = f"""
WITH lost AS (
    SELECT o.delivery_id FROM {TABLE} o
     WHERE o.published_at < %(cutoff)s
       AND CASE WHEN o.periodic THEN o.published_at < %(cutoff_retries)s
                ELSE o.published_at < %(cutoff_main)s END
       AND NOT EXISTS (SELECT 1 FROM {leases.TABLE} l WHERE l.delivery_id = o.delivery_id AND l.until > now())
     ORDER BY o.published_at
     LIMIT %(batch)s
     FOR UPDATE SKIP LOCKED
), republished AS (
    UPDATE {TABLE} o SET published_at = now(), periodic = true
     WHERE o.delivery_id = ANY(ARRAY(SELECT delivery_id FROM lost))
    RETURNING o.delivery_id, o.periodic, o.published_at
), orphaned AS (
    SELECT d.id FROM {leases.TABLE} l JOIN {_DELIVERY} d ON d.id = l.delivery_id
     WHERE l.until <= now() AND d.status = 'pending' AND d.parked_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM {TABLE} o WHERE o.delivery_id = d.id)
     LIMIT %(batch)s
     FOR UPDATE OF d SKIP LOCKED
), rescued AS (
    INSERT INTO {TABLE} AS o (delivery_id, due_at, published_at, periodic)
    SELECT id, now(), now(), true FROM orphaned
    ON CONFLICT (delivery_id) DO NOTHING
    RETURNING o.delivery_id, o.periodic, o.published_at
), expired AS (
    -- leases whose worker died: taken into account above, and of no use to anyone any more
    {leases.DELETE_EXPIRED_SQL}
)
SELECT * FROM republished UNION ALL SELECT * FROM rescued
"""
