"""Event intake: record the event, fan it out to matching endpoints, enqueue after commit."""
import logging
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from webhooks.event_types import matching_patterns
from webhooks.logcontext import request_id
from webhooks.models import Delivery, Endpoint, Event, Tenant
from webhooks.payload import build_payload

logger = logging.getLogger("herald.events")


def endpoints_matching(*, tenant: Tenant, event_type: str, channels: list[str]):
    """Enabled endpoints subscribed to this type and sharing a channel: one query, no loop."""
    type_match = Q(event_types=[]) | Q(event_types__overlap=matching_patterns(event_type))
    channel_match = Q(channels=[]) | Q(channels__overlap=channels) if channels else Q(channels=[])
    return Endpoint.objects.filter(tenant=tenant, enabled=True, deleted_at__isnull=True).filter(
        type_match, channel_match)


def event_ingest(*, tenant: Tenant, event_type: str, data: Any, channels: list[str],
                 now: datetime | None = None) -> Event:
    """Create the event and one pending delivery per matching endpoint in the caller's transaction.

    The delivery tasks are enqueued only once that transaction commits; a broker outage at that
    moment is logged, not raised: the rows are safe in PostgreSQL and the dispatcher sends them.
    """
    created_at = now or timezone.now()
    event = Event.objects.create(
        tenant=tenant, type=event_type, data=data, channels=channels, created_at=created_at,
        payload=build_payload(event_type=event_type, created_at=created_at, data=data),
        request_id=request_id.get(),
    )
    endpoint_ids = list(endpoints_matching(tenant=tenant, event_type=event_type, channels=channels)
                        .values_list("id", flat=True))
    deliveries = Delivery.objects.bulk_create([
        Delivery(tenant=tenant, event=event, endpoint_id=endpoint_id, next_attempt_at=created_at,
                 enqueued_at=created_at)
        for endpoint_id in endpoint_ids
    ])
    event.delivery_list = deliveries
    if deliveries:
        ids = [delivery.id for delivery in deliveries]
        transaction.on_commit(lambda: deliveries_enqueue(delivery_ids=ids), robust=True)
    return event


def deliveries_enqueue(*, delivery_ids: list[str]) -> None:
    """Publish one delivery task per id; imported lazily so intake never needs a worker module."""
    from webhooks.tasks import deliver

    for index, delivery_id in enumerate(delivery_ids):
        try:
            deliver.delay(delivery_id)
        except Exception as exc:  # broker down: stop trying, the dispatcher will enqueue them
            logger.warning("delivery enqueue failed; the dispatcher will send them",
                           extra={"delivery_ids": delivery_ids[index:], "error": repr(exc)})
            return
