"""The outbox (DeliveryOutbox): every write of its rows from Python is here, whole or as a part of a statement.

A delivery that needs a message has a row: written due and unpublished by intake (`insert_new`, in
the fan-out's statement) and by a manual retry (`insert_due`), marked published by a relay
(`TAKE_SQL`, fairly across tenants; `unmark` if the broker did not take the messages), published again by beat's
dispatcher when its message was lost (`LOST_SQL`), written published by a probe's wake-up
(`insert_published`), written due again when a worker hands a claimed delivery back unattempted (`hand_back`),
dropped when its delivery is finished (`drop_finished`, `delete_of`).

The PostgreSQL functions write it too (webhooks/sql/): the claim deletes a delivery's row (its message
has arrived), the record writes a retry's row due at its time, the hand-on writes a handed-on
delivery's row published now.

`tenant_id` is the delivery's tenant, for the relays' fair choice (webhooks/delivery/scheduling.py): the
statements that write unpublished rows in bulk (intake, a retry's record) write it; the trigger of
webhooks/sql/outbox_tenant.sql gives any other unpublished row its delivery's.

`periodic` says which queue the row's message goes (or went) to: the retry queue (HERALD_PERIODIC_QUEUE:
retries, hand-ons, re-publications) or the main one (first attempts).
"""
from django.db import connection

from webhooks.delivery import leases
from webhooks.models import Delivery, DeliveryOutbox, Tenant

TABLE = DeliveryOutbox._meta.db_table
_DELIVERY = Delivery._meta.db_table
_TENANT = Tenant._meta.db_table


def insert_new(source: str, *, due: str, tenant: str) -> str:
    """A part of a statement (a CTE's INSERT): the first attempts of new deliveries, `SELECT id, ... FROM
    {source}`, of the tenant `tenant`, due at `due` and unpublished, for the main queue (a relay publishes
    them)."""
    return f"""INSERT INTO {TABLE} (delivery_id, due_at, published_at, periodic, tenant_id)
    SELECT id, {due}, NULL, false, {tenant} FROM {source}"""


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


_HAND_BACK_SQL = f"""
WITH held AS (SELECT * FROM unnest(%(ids)s::varchar[], %(until)s::timestamptz[]) AS h(delivery_id, until)),
     released AS ({leases.release_of("held")})
{insert_due("released", due="now() + make_interval(secs => %(delay)s)")}
"""


def hand_back(*, claims: list[tuple[str, object]], delay: float) -> None:
    """Claimed deliveries a worker will not attempt after all ((delivery id, lease end) each): their leases go
    and they are due again `delay` seconds from now, unpublished (a relay publishes them, fairly), with no attempt
    and no retry step used. One whose lease ran out and was taken again is left to its new holder."""
    if claims:
        with connection.cursor() as cursor:
            cursor.execute(_HAND_BACK_SQL, {"ids": [i for i, _ in claims], "until": [u for _, u in claims],
                                            "delay": delay})


def delete_of(deliveries: str) -> str:
    """A part of a statement: the rows of the deliveries `deliveries` (a SELECT of ids) go; RETURNING 1 each."""
    return f"DELETE FROM {TABLE} o WHERE o.delivery_id IN ({deliveries}) RETURNING 1"


def drop_finished(*, endpoint_id: str) -> None:
    """The rows of the endpoint's deliveries that are no longer pending have nothing to publish."""
    DeliveryOutbox.objects.filter(delivery__endpoint_id=endpoint_id).exclude(
        delivery__status=Delivery.PENDING).delete()


# The relay's step, fair across tenants (webhooks/delivery/scheduling.py chooses; these statements find and
# take). Three short statements, each an index range scan over what it returns:
# - WINDOW_SQL: how many ids are published and not yet claimed (outbox_published, the newest only: a row
#   published more than WINDOW_SECONDS ago is either being worked off behind a full engine or lost, and the
#   dispatcher's business);
# - READY_SQL: the tenants with due, unpublished rows, in id order from %(start)s, skipping through
#   outbox_fair (one probe per tenant, however long its backlog), each with its weight; the walk stops
#   after %(tenants)s ready tenants (the outer LIMIT stops the recursion);
# - TAKE_SQL: up to n of each chosen tenant's due rows, oldest first, marked published. One whose delivery a
#   worker holds (a live lease) is that worker's. `FOR UPDATE SKIP LOCKED`: relays of several workers share
#   the work and never publish a delivery twice. The ids go through an array so that the outer UPDATE finds
#   each row by its key.
WINDOW_SECONDS = 5
WINDOW_SQL = f"""
SELECT count(*) FROM {TABLE} o WHERE o.published_at > now() - make_interval(secs => {WINDOW_SECONDS})
"""

READY_SQL = f"""
WITH RECURSIVE walk(tenant_id) AS (
    (SELECT o.tenant_id FROM {TABLE} o
      WHERE o.published_at IS NULL AND o.tenant_id >= %(start)s ORDER BY o.tenant_id LIMIT 1)
    UNION ALL
    SELECT (SELECT o.tenant_id FROM {TABLE} o
             WHERE o.published_at IS NULL AND o.tenant_id > w.tenant_id ORDER BY o.tenant_id LIMIT 1)
      FROM walk w WHERE w.tenant_id IS NOT NULL
)
SELECT w.tenant_id, coalesce((SELECT t.delivery_weight FROM {_TENANT} t WHERE t.id = w.tenant_id), 1)
  FROM walk w
 WHERE w.tenant_id IS NOT NULL
   AND (SELECT o.due_at FROM {TABLE} o WHERE o.tenant_id = w.tenant_id AND o.published_at IS NULL
         ORDER BY o.due_at LIMIT 1) <= now()
 LIMIT %(tenants)s
"""

# /metrics: the tenants with due, unpublished rows (the relays' walk, to the end), each one's waiting rows
# (counted up to %(cap)s) and the age of its oldest; one probe and at most `cap` index entries per tenant.
WAITING_BY_TENANT_SQL = f"""
WITH RECURSIVE walk(tenant_id) AS (
    (SELECT o.tenant_id FROM {TABLE} o WHERE o.published_at IS NULL ORDER BY o.tenant_id LIMIT 1)
    UNION ALL
    SELECT (SELECT o.tenant_id FROM {TABLE} o
             WHERE o.published_at IS NULL AND o.tenant_id > w.tenant_id ORDER BY o.tenant_id LIMIT 1)
      FROM walk w WHERE w.tenant_id IS NOT NULL
)
SELECT (SELECT count(*) FROM (SELECT 1 FROM {TABLE} o
                               WHERE o.tenant_id = w.tenant_id AND o.published_at IS NULL AND o.due_at <= now()
                               LIMIT %(cap)s) capped),
       EXTRACT(EPOCH FROM now() - (SELECT min(o.due_at) FROM {TABLE} o
                                    WHERE o.tenant_id = w.tenant_id AND o.published_at IS NULL))
  FROM walk w
 WHERE w.tenant_id IS NOT NULL
   AND (SELECT min(o.due_at) FROM {TABLE} o WHERE o.tenant_id = w.tenant_id AND o.published_at IS NULL) <= now()
"""

# The admin's tenant list: one tenant's due, unpublished rows (counted up to 1,000: "1000" means at least) and
# the due time of its oldest, `{tenant}` naming the tenant's id column of the outer query (outbox_fair).
WAITING_OF_TENANT = f"""SELECT count(*) FROM (SELECT 1 FROM {TABLE} o
     WHERE o.tenant_id = {{tenant}} AND o.published_at IS NULL AND o.due_at <= now() LIMIT 1000) capped"""
OLDEST_WAITING_OF_TENANT = f"""SELECT o.due_at FROM {TABLE} o
     WHERE o.tenant_id = {{tenant}} AND o.published_at IS NULL AND o.due_at <= now() ORDER BY o.due_at LIMIT 1"""

# is anything due and unpublished (outbox_due's first entry)? When the window is full, whether to wait for room
ANY_DUE_SQL = f"SELECT 1 FROM {TABLE} o WHERE o.published_at IS NULL AND o.due_at <= now() LIMIT 1"

TAKE_SQL = f"""
UPDATE {TABLE} o SET published_at = now()
 WHERE o.delivery_id = ANY(ARRAY(
        SELECT q.delivery_id
          FROM unnest(%(tenants)s::varchar[], %(takes)s::integer[]) AS a(tenant_id, take),
               LATERAL (SELECT q.delivery_id FROM {TABLE} q
                         WHERE q.tenant_id = a.tenant_id AND q.published_at IS NULL AND q.due_at <= now()
                           AND NOT EXISTS (SELECT 1 FROM {leases.TABLE} l
                                            WHERE l.delivery_id = q.delivery_id AND l.until > now())
                         ORDER BY q.due_at
                         LIMIT a.take
                           FOR UPDATE SKIP LOCKED) q))
RETURNING o.delivery_id, o.periodic, o.published_at, o.tenant_id
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
