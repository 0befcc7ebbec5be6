"""Operational endpoints: /healthz (database and broker reachable) and /metrics (Prometheus)."""
import hmac
import logging

from django.db import connection
from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, multiprocess

from config.celery import app as celery_app
from intake.longpoll import LongPollCollector
from intake.problems import problem_response
from webhooks.conf import herald_settings
from webhooks.delivery.metrics import DeliveryStateCollector
from webhooks.models import DISPATCHER

logger = logging.getLogger("herald.ops")

_state_registry = CollectorRegistry(auto_describe=False)
_state_registry.register(DeliveryStateCollector())
_state_registry.register(LongPollCollector())


def _database() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return "ok"
    except Exception as exc:
        logger.warning("healthz.database_down", extra={"error": repr(exc)})
        return "unavailable"


def _broker() -> str:
    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
            conn.default_channel  # noqa: B018 - opens the channel: a real round trip to the broker
        return "ok"
    except Exception as exc:
        logger.warning("healthz.broker_down", extra={"error": repr(exc)})
        return "unavailable"


@require_GET
def healthz(request):
    """200 when PostgreSQL and the broker answer, 503 (with which one failed) otherwise. It also tells
    how long ago beat's dispatcher last ran: past 3 intervals the status is `degraded` (still 200: the
    API serves, but retries and recoveries wait for a beat)."""
    checks = {"database": _database(), "broker": _broker()}
    healthy = all(value == "ok" for value in checks.values())
    age = dispatcher_age() if checks["database"] == "ok" else None
    stale = age is None or age > 3 * herald_settings.queues.WEBHOOK_DISPATCH_INTERVAL_SECONDS
    status = "unavailable" if not healthy else "degraded" if stale else "ok"
    body = {"status": status, **checks,
            "dispatcher": {"last_run_age_seconds": None if age is None else round(age, 1),
                           "status": "never ran" if age is None else "stale" if stale else "ok"}}
    return JsonResponse(body, status=200 if healthy else 503)


def dispatcher_age() -> float | None:
    """Seconds since beat's dispatcher last ran (None if it never did)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT EXTRACT(EPOCH FROM now() - at) FROM webhooks_heartbeat WHERE name = %s",
                       [DISPATCHER])
        row = cursor.fetchone()
    return float(row[0]) if row else None


def _presents(request, token: str) -> bool:
    scheme, _, presented = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), token.encode())


@require_GET
def metrics(request):
    """Prometheus text format; sums every gunicorn and Celery process when PROMETHEUS_MULTIPROC_DIR is set.
    With METRICS_TOKEN set, only a scrape presenting it as a bearer token gets an answer."""
    if herald_settings.metrics.METRICS_TOKEN and not _presents(request, herald_settings.metrics.METRICS_TOKEN):
        return problem_response(status_code=401, code="not_authenticated",
                                detail="Send the metrics token as `Authorization: Bearer <METRICS_TOKEN>`.",
                                headers={"WWW-Authenticate": 'Bearer realm="herald-metrics"'})
    if herald_settings.metrics.PROMETHEUS_MULTIPROC_DIR:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = REGISTRY
    body = generate_latest(registry) + generate_latest(_state_registry)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
