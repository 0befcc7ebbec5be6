"""The relay as a Celery task, for a platform that runs Celery beat: add it to `CELERY_BEAT_SCHEDULE`, e.g.
`{"herald-outbox": {"task": "herald_client.django.tasks.relay_outbox", "schedule": 2.0}}`. Each run sends
what is there (for up to `max_seconds`) and returns; runs that overlap are safe, as several relays are."""
from __future__ import annotations

from typing import Any

from celery import shared_task

from herald_client.django.relay import Relay


@shared_task(name="herald_client.django.tasks.relay_outbox", ignore_result=True)
def relay_outbox(max_seconds: float = 30.0, batch_size: int = 500) -> dict[str, Any]:
    """Send the outbox's committed rows to Herald; how many were sent and failed."""
    total = Relay(batch_size=batch_size).drain(max_seconds=max_seconds)
    return {"sent": total.sent, "failed": total.failed}
