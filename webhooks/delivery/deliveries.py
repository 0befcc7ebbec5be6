"""The deliveries (Delivery, webhooks_delivery): every write of them from Python, whole or as part of a statement.

Writers, and where each write is made:
- intake's fan-out inserts them (`insert_matched`, a part of webhooks/delivery/fanout.py's statements, one of
  which is rendered into the fast path's herald_event_intake, webhooks/sql/event_intake.sql);
- the claim parks, unparks and closes one, the record moves one on after its attempt, the hand-on unparks
  the ones given a freed slot: PL/pgSQL, webhooks/sql/delivery_claim.sql, delivery_record.sql and
  endpoint_hand_on.sql (their only copies);
- beat's probe of a tripped endpoint unparks its oldest (`unpark_oldest_of`, webhooks/delivery/parked.py);
- a manual retry or a recovery reopens finished ones (`reopen`, webhooks/delivery/retries.py);
- an endpoint disabled fails what waits for it (`fail_waiting`: webhooks/delivery/endpoints.py and the
  endpoint service), deleted cancels what is pending (`cancel_pending`, webhooks/services/endpoints.py);
- a poll endpoint's consumer numbers and acknowledges them (`number_unserved`, `acknowledge_served`,
  webhooks/services/polling.py);
- retention and a tenant's erasure delete them (`delete_final_of_events`, `delete_of_events_in`,
  webhooks/services/retention.py).
"""
from django.db.models import Exists, OuterRef
from django.db.models.functions import Now
from django.utils import timezone

from webhooks.delivery.destinations.kinds import NOT_PUSHED
from webhooks.models import Delivery, DeliveryLease, Endpoint

TABLE = Delivery._meta.db_table
_NOT_PUSHED = ", ".join(f"'{kind}'" for kind in NOT_PUSHED)  # kinds nobody sends to: poll


def insert_matched(matched: str, *, id_sql: str, event_sql: str, tenant: str, now: str) -> str:
    """A part of a statement: one pending delivery for each row of `matched` (`id`, `kind`: an endpoint),
    with the id `id_sql` and event `event_sql` give it. A delivery of a kind nobody sends to (poll, SPEC
    §12) gets no next_attempt_at: the claim, which takes only due deliveries, never sends it. RETURNING id,
    endpoint_id, and `polled` (no next_attempt_at)."""
    return f"""INSERT INTO {TABLE}
        (id, tenant_id, event_id, endpoint_id, status, attempt_count, next_attempt_at, created_at, updated_at)
    SELECT {id_sql}, {tenant}, {event_sql}, {matched}.id, 'pending', 0,
           CASE WHEN {matched}.kind IN ({_NOT_PUSHED}) THEN NULL ELSE {now} END, {now}, {now}
      FROM {matched}"""


def unpark_oldest_of(endpoints: str) -> str:
    """A part of a statement: the oldest parked delivery of each endpoint of `endpoints` (a relation with
    `id`) is parked no more; RETURNING its id."""
    return f"""UPDATE {TABLE} SET parked_at = NULL, updated_at = now()
     WHERE id IN (SELECT (SELECT d.id FROM {TABLE} d WHERE d.endpoint_id = {endpoints}.id AND d.parked_at IS NOT NULL
                           ORDER BY d.id LIMIT 1)
                    FROM {endpoints})
    RETURNING id"""


def reopen(*, held: str) -> str:
    """A part of a statement: the deliveries `%(ids)s` whose status is in `%(statuses)s` (and, with
    `%(unchanged_since)s`, not changed after it) and whose event is in `held` become pending, due at
    `%(now)s`; a poll endpoint's is served to its consumer again, after what it was served already (a new
    place in the order), and never claimed (no next_attempt_at). RETURNING id, endpoint_id, polled."""
    return f"""UPDATE {TABLE} d SET status = 'pending', parked_at = NULL, poll_seq = NULL, updated_at = %(now)s,
           next_attempt_at = CASE WHEN ep.kind IN ({_NOT_PUSHED}) THEN NULL ELSE %(now)s END
      FROM {Endpoint._meta.db_table} ep
     WHERE ep.id = d.endpoint_id
       AND d.id = ANY(%(ids)s) AND d.status = ANY(%(statuses)s) AND d.event_id IN (SELECT id FROM {held})
       AND (%(unchanged_since)s::timestamptz IS NULL OR d.updated_at <= %(unchanged_since)s)
    RETURNING d.id, d.endpoint_id, ep.kind IN ({_NOT_PUSHED}) AS polled"""


def acknowledge_served() -> str:
    """A part of a statement: every delivery of poll endpoint `%(endpoint)s` served up to cursor `%(after)s`
    that is still pending is succeeded, with its attempt counted; RETURNING id, attempt_count."""
    return f"""UPDATE {TABLE} d
       SET status = '{Delivery.SUCCEEDED}', attempt_count = d.attempt_count + 1, next_attempt_at = NULL,
           updated_at = now()
     WHERE d.endpoint_id = %(endpoint)s AND d.status = '{Delivery.PENDING}' AND d.poll_seq <= %(after)s
    RETURNING d.id, d.attempt_count"""


def number_unserved() -> str:
    """A statement: poll endpoint `%(endpoint)s`'s pending deliveries never served yet get the next numbers
    after the greater of its last one and `%(after)s`, oldest event first, `%(limit)s` of them at most."""
    return f"""
WITH top AS (
    SELECT greatest(coalesce(max(poll_seq), 0), %(after)s) AS last
      FROM {TABLE} WHERE endpoint_id = %(endpoint)s AND poll_seq IS NOT NULL
), fresh AS (
    SELECT id, row_number() OVER (ORDER BY id) AS rank
      FROM (SELECT id FROM {TABLE}
             WHERE endpoint_id = %(endpoint)s AND status = '{Delivery.PENDING}' AND poll_seq IS NULL
             ORDER BY id LIMIT %(limit)s) unserved
)
UPDATE {TABLE} d SET poll_seq = top.last + fresh.rank FROM top, fresh WHERE d.id = fresh.id
"""


def of_events_bounds(column: str, events: str) -> str:
    """A part of a WHERE: `column` (a delivery id) within the ids the deliveries of `events` (a SELECT of event
    ids) can have. A delivery's id extends its event's, so this names the days those events lie in, and
    PostgreSQL reads only those days' partitions (webhooks/services/partitions.py) instead of probing every
    day's for each event."""
    return (f"{column} >= (SELECT 'dlv_' || substr(min(b.id), 5) FROM ({events}) b(id)) "
            f"AND {column} < (SELECT 'dlv_' || substr(max(b.id), 5) || 'Z' FROM ({events}) b(id))")


def delete_final_of_events(events: str) -> str:
    """A part of a statement: the deliveries of `events` (an array of event ids) that are final go (a
    pending delivery is never deleted); RETURNING 1 each."""
    return (f"DELETE FROM {TABLE} d WHERE d.event_id = ANY({events}) AND d.status <> 'pending' "
            f"AND {of_events_bounds('d.id', f'SELECT unnest(CAST({events} AS varchar[]))')} RETURNING 1")


def delete_of_events_in(events: str) -> str:
    """A part of a statement: every delivery of `events` (a SELECT of event ids), whatever its state, goes (a
    deleted tenant's); RETURNING its id."""
    return f"DELETE FROM {TABLE} d WHERE d.event_id IN ({events}) AND {of_events_bounds('d.id', events)} RETURNING d.id"


def fail_waiting(*, endpoint_id: str) -> int:
    """A disabled endpoint receives nothing: what waits for it (not in flight) is failed now."""
    in_flight = DeliveryLease.objects.filter(delivery=OuterRef("pk"), until__gt=Now())
    return Delivery.objects.filter(endpoint_id=endpoint_id, status=Delivery.PENDING).exclude(
        Exists(in_flight)).update(status=Delivery.FAILED, next_attempt_at=None, parked_at=None, updated_at=Now())


def cancel_pending(*, endpoint_id: str) -> int:
    """A deleted endpoint's pending deliveries are cancelled (a late record of one in flight keeps it so)."""
    return Delivery.objects.filter(endpoint_id=endpoint_id, status=Delivery.PENDING).update(
        status=Delivery.CANCELLED, next_attempt_at=None, parked_at=None, updated_at=timezone.now())
