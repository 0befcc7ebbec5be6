"""Delivery metrics: attempts (by outcome and endpoint class), their duration and the breaker's
transitions, counted per process; the queue's state and the live workers, read from PostgreSQL."""
import os
import socket
from datetime import datetime

from django.db import connection
from prometheus_client import Counter, Histogram, values
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily

from webhooks.delivery.breaker import RECOVERED, TRIPPED
from webhooks.conf import herald_settings
from webhooks.delivery import outbox
from webhooks.liveness import WORKER_PREFIX
from webhooks.models import DISPATCHER, DeliveryCount, DeliveryLease, DeliveryOutbox, Endpoint, Heartbeat
from webhooks.delivery.destinations.base import AttemptResult

if herald_settings.metrics.PROMETHEUS_MULTIPROC_DIR:
    # Containers sharing one metrics volume all number their processes from 1: name each file by
    # host and pid so a web worker and a Celery child never write the same file. No underscores:
    # prometheus_client splits file names on them.
    values.ValueClass = values.MultiProcessValue(
        lambda: f"{socket.gethostname()}-{os.getpid()}".replace("_", "-"))

delivery_attempts = Counter("herald_delivery_attempts", "Webhook delivery attempts by outcome and endpoint class",
                            ["outcome", "endpoint_class"])
attempt_duration = Histogram(
    "herald_delivery_attempt_duration_seconds", "Duration of one webhook delivery attempt",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30, 60))
breaker_transitions = Counter("herald_endpoint_breaker_transitions",
                              "Endpoint circuit breakers tripped or recovered", ["transition"])

# The endpoint class of an attempt: how its endpoint stood when the attempt was recorded (before it
# counts). `healthy`: its last attempt succeeded (or it has none); `failing`: its attempts have failed
# for less than DOWN_AFTER_SECONDS; `down`: for longer. Attempts to healthy and failing endpoints are
# those to receivers that worked within the hour: when many of them fail, the trouble is more likely
# Herald's (its network, DNS, a proxy) or a shared one than a customer's, and the alert says so
# (deploy/prometheus/herald-rules.yml). Three values, whatever the number of endpoints.
HEALTHY, FAILING, DOWN = "healthy", "failing", "down"
DOWN_AFTER_SECONDS = 3600

# Every series exists from the start, at 0: a series that first appears with its first increment
# already in it loses that increment to rate(), and a rare failure would go unseen.
for _outcome in ("success", "http_error", "timeout", "network_error"):
    for _class in (HEALTHY, FAILING, DOWN):
        delivery_attempts.labels(_outcome, _class)
for _transition in (TRIPPED, RECOVERED):
    breaker_transitions.labels(_transition)


def endpoint_class(*, failing_since: datetime | None, now: datetime) -> str:
    if failing_since is None:
        return HEALTHY
    return FAILING if (now - failing_since).total_seconds() < DOWN_AFTER_SECONDS else DOWN


def attempt_outcome(result: AttemptResult) -> str:
    if result.ok:
        return "success"
    if result.status is not None:
        return "http_error"
    if result.error.startswith("timeout"):
        return "timeout"
    return "network_error"


def record_attempt(result: AttemptResult, *, endpoint: str, transition: str | None = None) -> None:
    delivery_attempts.labels(attempt_outcome(result), endpoint).inc()
    attempt_duration.observe(result.duration_ms / 1000)
    if transition:
        breaker_transitions.labels(transition).inc()


class DeliveryStateCollector:
    """Pending and failed deliveries, the age of the oldest due one, attempts in flight, tripped endpoints,
    the dispatcher's last run and the live workers, read at scrape time.

    Read from the database rather than counted in processes, so they are right however many
    gunicorn and Celery processes and hosts there are, and survive restarts. None grows with the
    deliveries stored (10M deliveries: see the README's figures): pending and failed are sums over
    DeliveryCount's few shard rows, which triggers keep exact; the oldest due delivery comes from
    the outbox's two indexes (the first unpublished due row, and the row published longest ago,
    still unclaimed); leases, tripped endpoints (a partial index) and heartbeats are small.
    """

    _SQL = f"""
        SELECT (SELECT coalesce(sum(pending), 0) FROM {DeliveryCount._meta.db_table}),
               (SELECT coalesce(sum(failed), 0) FROM {DeliveryCount._meta.db_table}),
               COALESCE(EXTRACT(EPOCH FROM now() - LEAST(
                   (SELECT min(due_at) FROM {DeliveryOutbox._meta.db_table}
                     WHERE published_at IS NULL AND due_at <= now()),
                   (SELECT o.due_at FROM {DeliveryOutbox._meta.db_table} o
                     WHERE o.published_at IS NOT NULL ORDER BY o.published_at LIMIT 1))), 0),
               (SELECT count(*) FROM {DeliveryLease._meta.db_table} WHERE until > now()),
               (SELECT count(*) FROM {Endpoint._meta.db_table}
                 WHERE tripped_at IS NOT NULL AND enabled AND deleted_at IS NULL),
               (SELECT EXTRACT(EPOCH FROM now() - at) FROM {Heartbeat._meta.db_table} WHERE name = '{DISPATCHER}'),
               (SELECT count(*) FROM {Heartbeat._meta.db_table}
                 WHERE name LIKE '{WORKER_PREFIX}%%' AND at > now() - make_interval(secs => %(live)s))
    """

    def collect(self):
        with connection.cursor() as cursor:
            cursor.execute(self._SQL, {"live": 3 * herald_settings.worker.WEBHOOK_WORKER_HEARTBEAT_SECONDS})
            pending, failed, oldest, in_flight, tripped, dispatcher_age, workers = cursor.fetchone()
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
        yield from self._tenants_waiting()
        yield GaugeMetricFamily("herald_workers_live",
                                "Workers consuming, on every host: a heartbeat in PostgreSQL within 3 intervals",
                                value=workers)

    # Waiting depth (due, unpublished outbox rows) counted up to DEPTH_CAP per tenant: the last bucket is "more".
    DEPTH_BUCKETS = (1, 10, 100, 1000)
    DEPTH_CAP = 1001
    AGE_BUCKETS = (1, 5, 30, 60, 300, 3600)

    def _tenants_waiting(self):
        """How the tenants with deliveries waiting for the relays' choice stand (webhooks/delivery/scheduling.py):
        two histograms over tenants, no label per tenant: how many each has waiting, and how long its oldest
        has waited. One index probe per waiting tenant, and at most DEPTH_CAP index entries each."""
        with connection.cursor() as cursor:
            cursor.execute(outbox.WAITING_BY_TENANT_SQL, {"cap": self.DEPTH_CAP})
            rows = cursor.fetchall()
        depths = [depth for depth, _ in rows]
        ages = [float(age) for _, age in rows]
        yield HistogramMetricFamily(
            "herald_tenant_waiting_deliveries",
            f"Tenants by deliveries due and waiting to be published (counted up to {self.DEPTH_CAP - 1} each)",
            buckets=_buckets(depths, self.DEPTH_BUCKETS), sum_value=sum(depths))
        yield HistogramMetricFamily(
            "herald_tenant_oldest_waiting_seconds",
            "Tenants by how long their oldest due delivery has waited to be published",
            buckets=_buckets(ages, self.AGE_BUCKETS), sum_value=sum(ages))


def _buckets(values: list[float], bounds: tuple) -> list[tuple[str, int]]:
    return [*((str(bound), sum(1 for v in values if v <= bound)) for bound in bounds), ("+Inf", len(values))]
