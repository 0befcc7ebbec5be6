"""Talking to the broker: publish delivery tasks, and ask how many messages wait in each queue."""
import logging

from celery import current_app
from django.conf import settings
from kombu import Queue

logger = logging.getLogger("herald.publishing")


def deliveries_enqueue(*, delivery_ids: list[str], inline: bool | None = None, queue: str | None = None) -> None:
    """Publish one delivery task per id, in one round trip to the broker.

    Building a Celery message costs a fraction of a millisecond of CPU; for a large fan-out the web
    process hands the ids to a worker in chunks instead (`webhooks.enqueue_deliveries`), which
    publishes the per-delivery tasks, so intake latency does not grow with the endpoint count.
    """
    from webhooks.tasks import deliver, enqueue_deliveries

    if inline is None:
        inline = len(delivery_ids) <= settings.WEBHOOK_INLINE_ENQUEUE_MAX
    try:
        if len(delivery_ids) == 1:  # the common case: a pipeline would only add overhead
            deliver.apply_async((delivery_ids[0],), queue=queue, argsrepr=delivery_ids[0], kwargsrepr="")
            return
        with deliver.app.producer_or_acquire() as producer, producer.batch():
            if inline:
                for delivery_id in delivery_ids:
                    deliver.apply_async((delivery_id,), producer=producer, queue=queue, argsrepr=delivery_id,
                                        kwargsrepr="")
            else:
                chunk = settings.WEBHOOK_ENQUEUE_CHUNK
                for start in range(0, len(delivery_ids), chunk):
                    part = delivery_ids[start:start + chunk]
                    enqueue_deliveries.apply_async((part,), producer=producer, argsrepr=f"[{len(part)} ids]")
    except Exception as exc:  # broker down: the rows are safe and the dispatcher will enqueue them
        logger.warning("delivery.enqueue_failed", extra={"delivery_ids": delivery_ids[:20],
                                                          "count": len(delivery_ids), "error": repr(exc)})


def broker_backlog() -> dict[str, int]:
    """Messages waiting in each of Herald's queues, as the broker counts them (a queue declare, via kombu)."""
    app = current_app
    with app.connection_for_read() as connection:
        channel = connection.default_channel
        # Not passive: a queue nobody has used yet is created empty, as a worker would create it.
        return {queue.name: Queue(queue.name, queue.exchange, queue.routing_key, channel=channel)
                .queue_declare().message_count for queue in app.conf.task_queues}
