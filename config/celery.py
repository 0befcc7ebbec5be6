"""The Celery app, configured from the CELERY_* Django settings (config/celeryconfig.py), JSON only."""
import os

from celery import Celery, bootsteps, signals

from webhooks.conf import herald_settings

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("herald")
app.config_from_object("config.celeryconfig")
app.autodiscover_tasks()


class Liveness(bootsteps.StartStopStep):
    """The worker's heartbeat in PostgreSQL (webhooks/liveness.py), sent from the consumer's event loop
    while it consumes: started once the worker consumes tasks, stopped when it loses the broker."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent, **kwargs):
        self.heart = self.tref = None
        super().__init__(parent, **kwargs)

    def start(self, parent):
        from django.conf import settings

        from webhooks.liveness import Heart

        self.heart = Heart(parent.hostname)
        self.heart.beat()
        self.tref = parent.timer.call_repeatedly(herald_settings.worker.WEBHOOK_WORKER_HEARTBEAT_SECONDS,
                                                 self.heart.beat)

    def stop(self, parent, wait: float = 0):
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None
        if self.heart is not None:
            self.heart.stop(wait)
            self.heart = None

    def shutdown(self, parent):
        from webhooks.liveness import forget

        self.stop(parent, wait=5)  # a write under way must not bring the row back after it is deleted
        forget(parent.hostname)


app.steps["consumer"].add(Liveness)


def _pool_name(pool_cls) -> str:
    return pool_cls if isinstance(pool_cls, str) else f"{pool_cls.__module__}.{pool_cls.__name__}"


@signals.worker_init.connect
def _refuse_unsafe_worker(**kwargs) -> None:
    from config.startup import refuse_unsafe_start

    refuse_unsafe_start("worker")


@signals.beat_init.connect
def _refuse_unsafe_beat(**kwargs) -> None:
    from config.startup import refuse_unsafe_start

    refuse_unsafe_start("beat")


@signals.worker_init.connect
@signals.beat_init.connect
def _limit_sessions(**kwargs) -> None:
    """A worker's or beat's sessions end when its host is lost (config/startup.py); before any connection,
    and before _share_database_connections copies the options into the worker's pool."""
    from config.startup import limit_worker_sessions

    limit_worker_sessions()


@signals.worker_init.connect
def _start_tracing(sender=None, **kwargs) -> None:
    """Traces, when OTEL_EXPORTER_OTLP_ENDPOINT is set (webhooks/tracing.py): before the engine, the relay and
    the database pool start, so their connections are instrumented. A prefork worker's children each start
    their own (below): an exporter's thread does not survive a fork."""
    if sender is not None and "prefork" in _pool_name(sender.pool_cls):
        return
    from webhooks import tracing

    tracing.setup("worker")


@signals.worker_process_init.connect
def _start_tracing_in_child(**kwargs) -> None:
    from webhooks import tracing

    tracing.setup("worker")


@signals.worker_init.connect
def _share_database_connections(sender=None, **kwargs) -> None:
    """A threaded worker's threads share a bounded psycopg pool instead of a connection each.

    WEBHOOK_WORKER_CONCURRENCY threads would otherwise open as many PostgreSQL connections. With
    the pool (Django's `"pool"` option) a connection goes back to it whenever Django closes one, so
    a thread holds one only while it claims or records; WEBHOOK_WORKER_DB_POOL_SIZE is the most
    this process will ever open. A prefork worker keeps one connection per child, as before.
    """
    if sender is None or any(name in _pool_name(sender.pool_cls) for name in ("prefork", "solo")):
        return
    from django.conf import settings
    from django.db import connections

    connections.close_all()
    database = connections.settings["default"]  # the dict every thread's connection is built from
    database["CONN_MAX_AGE"] = 0  # a "closed" connection returns to the pool; the pool keeps it open
    # No `SELECT 1` on every checkout (a round trip per claim and per record): a connection broken by a
    # PostgreSQL restart fails once, is dropped by the pool, and the claim or record is tried again.
    database["CONN_HEALTH_CHECKS"] = False
    database["OPTIONS"] = {**database["OPTIONS"], "application_name": "herald-worker", "pool": {
        "min_size": 1, "max_size": herald_settings.worker.WEBHOOK_WORKER_DB_POOL_SIZE, "timeout": 30,
        "name": "herald-worker"}}
    from webhooks.delivery import engine
    from webhooks.delivery import relay

    _allow_descriptors(herald_settings.worker.WEBHOOK_WORKER_CONCURRENCY)
    engine.start(concurrency=herald_settings.worker.WEBHOOK_WORKER_CONCURRENCY)
    relay.start()


def _allow_descriptors(in_flight: int) -> None:
    """A connection per attempt in flight, and some for PostgreSQL, the broker and the logs: raise the soft
    limit on open files towards the hard one (often 1024 soft, far more hard) when it is too low."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = in_flight + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))


@signals.worker_init.connect
def _warn_if_autovacuum_off(**kwargs) -> None:
    """Before the worker says it is ready (config/startup.py)."""
    from config.startup import warn_if_autovacuum_off

    warn_if_autovacuum_off()


@signals.worker_ready.connect
@signals.worker_process_init.connect
@signals.beat_init.connect
def _freeze_startup_objects(**kwargs) -> None:
    """Once started (a worker ready, a prefork child, beat), what lives as long as the process is frozen
    (config/startup.py)."""
    from config.startup import freeze_startup_objects

    freeze_startup_objects()


@signals.worker_shutdown.connect
def _finish_attempts_in_flight(**kwargs) -> None:
    """A worker shutting down lets its engine finish and record the attempts it has in flight."""
    from django.conf import settings

    from webhooks.delivery import engine

    running = engine.running()
    if running is not None and not running.drain(herald_settings.delivery.WEBHOOK_TIMEOUT_SECONDS + 5):
        import logging

        logging.getLogger("herald.engine").warning("engine.drain_timed_out")


@signals.task_prerun.connect
def _check_database_connections(**kwargs) -> None:
    """Drop connections that broke (a PostgreSQL restart) or outlived CONN_MAX_AGE, as Django does."""
    from django.db import close_old_connections

    close_old_connections()


@signals.task_postrun.connect
def _return_pooled_connections(**kwargs) -> None:
    """With the pool, a finished task gives its connection back for the other threads."""
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        if conn.settings_dict["OPTIONS"].get("pool"):
            conn.close()
