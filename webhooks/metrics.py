"""Delivery metrics: attempts and their duration (per process), and queue state read from PostgreSQL."""
import os
import socket

from django.db import connection
from prometheus_client import Counter, Histogram, values
from prometheus_client.core import GaugeMetricFamily

from webhooks.models import DISPATCHER, Delivery, DeliveryLease, DeliveryOutbox, Endpoint, Heartbeat
from webhooks.transport import AttemptResult

if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    # Containers sharing one metrics volume all number their processes from 1: name each file by
    # host and pid so a web worker and a Celery child never write the same file. No underscores:
    # prometheus_client splits file names on them.
    values.ValueClass = values.MultiProcessValue(
        lambda: f"{socket.gethostname()}-{os.getpid()}".replace("_", "-"))

delivery_attempts = Counter("herald_delivery_attempts", "Webhook delivery attempts by outcome", ["outcome"])
attempt_duration = Histogram(
    "herald_delivery_attempt_duration_seconds", "Duration of one webhook delivery attempt",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30, 60))


def attempt_outcome(result: AttemptResult) -> str:
    if result.ok:
        return "success"
    if result.status is not None:
        return "http_error"
    if result.error.startswith("timeout"):
        return "timeout"
    return "network_error"


def record_attempt(result: AttemptResult) -> None:
    delivery_attempts.labels(attempt_outcome(result)).inc()
    attempt_duration.observe(result.duration_ms / 1000)


class DeliveryStateCollector:
    """Pending and failed deliveries and the age of the oldest due one, read at scrape time.

    Read from the database rather than counted in processes, so they are right however many
    gunicorn and Celery processes there are, and survive restarts.
    """

    # Each from an index, never a scan of the delivery table (5M deliveries: see the README's figures):
    # pending from delivery_pending_order, failed from delivery_failed (index-only scans of the rows
    # counted), the oldest due from the outbox's two indexes (the first unpublished due row, and the
    # row published longest ago, still unclaimed), live leases and tripped endpoints from small tables.
    _SQL = f"""
        SELECT (SELECT count(*) FROM {Delivery._meta.db_table} WHERE status = 'pending'),
               (SELECT count(*) FROM {Delivery._meta.db_table} WHERE status = 'failed'),
               COALESCE(EXTRACT(EPOCH FROM now() - LEAST(
                   (SELECT min(due_at) FROM {DeliveryOutbox._meta.db_table}
                     WHERE published_at IS NULL AND due_at <= now()),
                   (SELECT o.due_at FROM {DeliveryOutbox._meta.db_table} o
                     WHERE o.published_at IS NOT NULL ORDER BY o.published_at LIMIT 1))), 0),
               (SELECT count(*) FROM {DeliveryLease._meta.db_table} WHERE until > now()),
               (SELECT count(*) FROM {Endpoint._meta.db_table}
                 WHERE tripped_at IS NOT NULL AND enabled AND deleted_at IS NULL),
               (SELECT EXTRACT(EPOCH FROM now() - at) FROM {Heartbeat._meta.db_table} WHERE name = '{DISPATCHER}')
    """

    def collect(self):
        with connection.cursor() as cursor:
            cursor.execute(self._SQL)
            pending, failed, oldest, in_flight, tripped, dispatcher_age = cursor.fetchone()
        yield GaugeMetricFamily("herald_delivery_attempts_in_flight",
                                "Attempts holding a live lease, across every worker", value=in_flight)
        yield GaugeMetricFamily("herald_endpoints_tripped", "Endpoints whose circuit breaker is open", value=tripped)
        yield GaugeMetricFamily("herald_deliveries_pending", "Deliveries waiting to be sent", value=pending)
        yield GaugeMetricFamily("herald_deliveries_failed", "Deliveries that exhausted their schedule", value=failed)
        if dispatcher_age is not None:
            yield GaugeMetricFamily("herald_dispatcher_last_run_age_seconds",
                                    "Seconds since beat's dispatcher last ran", value=float(dispatcher_age))
        yield GaugeMetricFamily("herald_oldest_due_delivery_age_seconds",
                                "How long the oldest due delivery has waited for a worker (parked ones aside)",
                                value=float(oldest))
