"""The endpoints (Endpoint, webhooks_endpoint): every write of them from Python, whole or as part of a statement.

Writers, and where each write is made:
- the endpoint service creates, changes and soft-deletes one (`endpoint_insert`, `endpoint_write`,
  `endpoint_soft_delete`: webhooks/services/endpoints.py, for the API, the portal and the admin);
- the record of attempts writes their breakers' fields (`breakers_write`, webhooks/delivery/record.py) and
  disables one whose destination is gone (`endpoint_disable`, which beat's sweep of endpoints failing for too
  long and the endpoint service call too);
- the claim moves a probe's next_probe_at and the throttle's throttle_tat on: PL/pgSQL,
  webhooks/sql/delivery_claim.sql (its only copy);
- a tenant's deletion takes its endpoints down (`endpoints_of_tenant_take_down`, intake/tenants.py), and its
  erasure deletes them (`delete_of`, a part of webhooks/services/retention.py's statement).
"""
import json
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from webhooks import event_types
from webhooks.delivery import deliveries, outbox
from webhooks.delivery.fanout import event_emit_operational
from webhooks.models import Endpoint, Tenant

TABLE = Endpoint._meta.db_table


def endpoint_insert(**fields) -> Endpoint:
    """A new endpoint row (the endpoint service has checked every field)."""
    return Endpoint.objects.create(**fields)


def endpoint_write(*, endpoint_id: str, **fields) -> int:
    """Write only the named columns of a live endpoint (never a stale copy of the whole row: a concurrent
    breaker trip or disable by a worker stays), with updated_at; the rows written (0: it was deleted)."""
    return Endpoint.objects.filter(pk=endpoint_id, deleted_at__isnull=True).update(**fields, updated_at=timezone.now())


def endpoint_soft_delete(*, endpoint_id: str, now: datetime) -> None:
    """The endpoint is gone for the API (its history stays readable) and receives nothing more."""
    Endpoint.objects.filter(pk=endpoint_id).update(deleted_at=now, enabled=False, updated_at=now)


def endpoints_of_tenant_take_down(*, tenant: Tenant, now: datetime) -> int:
    """A deleted tenant's endpoints, all at once: deleted and disabled (the claim closes what is queued)."""
    return Endpoint.objects.filter(tenant=tenant, deleted_at__isnull=True).update(deleted_at=now, enabled=False,
                                                                                 updated_at=now)


def delete_of(ids: str) -> str:
    """A part of a statement: the endpoints in `ids` (a SELECT; none has a delivery left) go; RETURNING 1 each."""
    return f"DELETE FROM {TABLE} e WHERE e.id IN ({ids}) RETURNING 1"


# The breaker's columns (webhooks/delivery/breaker.py's BreakerChange.fields) of many endpoints in one statement;
# a column an endpoint's change does not name keeps its value.
_BREAKERS_WRITE_SQL = f"""
UPDATE {TABLE} e
   SET consecutive_failures = CASE WHEN c ? 'consecutive_failures' THEN (c->>'consecutive_failures')::integer
                                   ELSE e.consecutive_failures END,
       failing_since = CASE WHEN c ? 'failing_since' THEN (c->>'failing_since')::timestamptz ELSE e.failing_since END,
       tripped_at = CASE WHEN c ? 'tripped_at' THEN (c->>'tripped_at')::timestamptz ELSE e.tripped_at END,
       next_probe_at = CASE WHEN c ? 'next_probe_at' THEN (c->>'next_probe_at')::timestamptz ELSE e.next_probe_at END,
       failed_probes = CASE WHEN c ? 'failed_probes' THEN (c->>'failed_probes')::integer ELSE e.failed_probes END
  FROM jsonb_each(%(changes)s::jsonb) AS x(endpoint_id, c)
 WHERE e.id = x.endpoint_id
"""
BREAKER_FIELDS = frozenset({"consecutive_failures", "failing_since", "tripped_at", "next_probe_at", "failed_probes"})


def breakers_write(cursor, changes: dict[str, dict]) -> None:
    """The breakers' changes after a batch of attempts ({endpoint id: BreakerChange.fields}), in the record's
    transaction, which holds the endpoints' locks."""
    changes = {endpoint_id: fields for endpoint_id, fields in changes.items() if fields}
    if changes:
        assert all(set(fields) <= BREAKER_FIELDS for fields in changes.values()), changes
        cursor.execute(_BREAKERS_WRITE_SQL, {"changes": json.dumps(
            {endpoint_id: {k: v.isoformat() if isinstance(v, datetime) else v for k, v in fields.items()}
             for endpoint_id, fields in changes.items()})})


def deliveries_fail_waiting(*, endpoint_id: str) -> int:
    """A disabled endpoint receives nothing: what waits for it (not in flight) is failed now, and its outbox
    rows go."""
    failed = deliveries.fail_waiting(endpoint_id=endpoint_id)
    outbox.drop_finished(endpoint_id=endpoint_id)
    return failed


@transaction.atomic
def endpoint_disable(*, endpoint_id: str, reason: str, notify: bool = True) -> bool:
    """Disable an enabled endpoint for `reason`, fail what waits for it, and tell the tenant with a
    `herald.endpoint.disabled` event (SPEC §8) unless `notify` is off. False if it was not enabled."""
    row = Endpoint.objects.filter(pk=endpoint_id, enabled=True, deleted_at__isnull=True)
    found = list(row.values_list("tenant_id", "url"))
    if not found or not row.update(enabled=False, disabled_reason=reason, updated_at=timezone.now()):
        return False
    deliveries_fail_waiting(endpoint_id=endpoint_id)
    if notify:
        tenant_id, url = found[0]
        event_emit_operational(tenant_id=tenant_id, event_type=event_types.ENDPOINT_DISABLED,
                               data={"endpoint_id": endpoint_id, "url": url, "reason": reason})
    return True
