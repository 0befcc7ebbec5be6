"""The manual retry's rule, for one delivery (the API, the portal, the admin) or many (a recovery)."""
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from webhooks.delivery import deliveries, outbox
from webhooks.delivery.publishing import poll_notify, publisher
from webhooks.models import Delivery, Event

_DELIVERY = Delivery._meta.db_table

# A finished delivery becomes pending and due now, with a due, unpublished outbox row (a relay publishes
# it at once, to the retry queue like every retry). The event rows are held with KEY SHARE first:
# retention deletes an event with its final deliveries under its row lock, so it is held off (or waited
# for, and the delivery found gone).
_RETRY_SQL = f"""
WITH held AS (
    SELECT e.id FROM {Event._meta.db_table} e
     WHERE e.id IN (SELECT d.event_id FROM {_DELIVERY} d WHERE d.id = ANY(%(ids)s))
       FOR KEY SHARE
), retried AS (
    -- a poll endpoint's delivery is served to its consumer again; it gets no outbox row
    {deliveries.reopen(held="held")}
), queued AS (
    {outbox.insert_due("retried WHERE NOT polled", due="%(now)s")}
)
SELECT id, endpoint_id, polled FROM retried
"""
RETRYABLE = (Delivery.FAILED, Delivery.SUCCEEDED)


def deliveries_retry(*, delivery_ids: list[str], now: datetime, statuses: tuple[str, ...] = RETRYABLE,
                     unchanged_since: datetime | None = None) -> list[str]:
    """Manual retry of many deliveries, in the caller's transaction: each one whose status is in `statuses`
    (and, with `unchanged_since`, not changed after it) becomes pending, due at `now`, and is published
    after commit (see _RETRY_SQL); any other is left be.
    Returns the ids it retried. The one owner of the rule: a single retry and a recovery both use it."""
    if not delivery_ids:
        return []
    with connection.cursor() as cursor:
        cursor.execute(_RETRY_SQL, {"ids": list(delivery_ids), "now": now, "statuses": list(statuses),
                                    "unchanged_since": unchanged_since})
        rows = cursor.fetchall()
    if any(not polled for _, _, polled in rows):
        transaction.on_commit(publisher.ring, robust=True)
    polled = [endpoint_id for _, endpoint_id, polled in rows if polled]
    if polled:
        poll_notify(endpoint_ids=polled)
    return [delivery_id for delivery_id, _, _ in rows]


@transaction.atomic
def delivery_retry(*, delivery: Delivery) -> Delivery:
    """Manual retry: a finished delivery becomes pending and due now (see `deliveries_retry`; a poll
    endpoint's is served to its consumer again); a pending one is left be. Delivery.DoesNotExist if
    retention deleted it meanwhile."""
    deliveries_retry(delivery_ids=[delivery.pk], now=timezone.now())
    delivery.refresh_from_db()
    return delivery
