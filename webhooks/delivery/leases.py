"""The lease (DeliveryLease): a claim takes it, so that no delivery is ever sent twice at once.

The claim (webhooks/delivery/claim.py, calling `herald_delivery_claim`: webhooks/sql/delivery_claim.sql)
takes it under the endpoint's row lock, after counting the live leases against the endpoint's cap and
reading its breaker, ordering and throttle; a delivery that may not go now is *parked*: no attempt, no
retry step, no worker held. The record
(webhooks/delivery/attempts.py) releases the lease; beat's dispatcher deletes the leases whose worker
died (`DELETE_EXPIRED_SQL`), retention those of what it deletes (`delete_of`).
"""
import threading

from webhooks.models import DeliveryLease

TABLE = DeliveryLease._meta.db_table

DELETE_EXPIRED_SQL = f"DELETE FROM {TABLE} WHERE until <= now()"

# Rung after every claim of this process: a claim deletes its deliveries' outbox rows (their messages have
# arrived), which makes room in the publish window. A relay whose window is full waits on it
# (webhooks/delivery/relay.py) instead of looking for room on a timer: the worker's relay and engine are
# one process, so the room its own claims make is used at once, with no round trip to anyone.
window_freed = threading.Event()


def release_of(held: str) -> str:
    """A part of a statement: the leases of `held` (rows of delivery_id, until) go, each only if it is still the
    one taken (a lease that ran out and was taken again is another worker's); RETURNING the delivery's id as id."""
    return (f"DELETE FROM {TABLE} l USING {held} h WHERE l.delivery_id = h.delivery_id AND l.until = h.until "
            "RETURNING l.delivery_id AS id")


def delete_of(column: str, ids: str) -> str:
    """A part of a statement: the leases whose `column` (delivery_id or endpoint_id) is in `ids` (a SELECT)
    go; RETURNING 1 each."""
    return f"DELETE FROM {TABLE} l WHERE l.{column} IN ({ids}) RETURNING 1"
