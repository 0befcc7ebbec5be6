"""Worker heartbeats in PostgreSQL, so that /metrics can say how many workers are live on every host.

Workers serve no HTTP, and /metrics sums the processes of one host only (PROMETHEUS_MULTIPROC_DIR),
so neither a scrape of a worker nor a per-process gauge can tell that the workers of another host,
or all of them, are gone. Instead each worker writes `worker:<its Celery hostname>` into the
Heartbeat table every WEBHOOK_WORKER_HEARTBEAT_SECONDS, from its consumer's event loop (a Celery
bootstep, config/celery.py): the beat stops when the worker dies, hangs, or loses its broker
connection (the consumer's steps stop until it reconnects), not only when its process exits. A worker
shutting down deletes its row. /metrics counts the rows younger than three intervals
(`herald_workers_live`), whichever web process on whichever host is scraped.

The write runs on a thread of its own, so a slow database never holds up the event loop; rows of
workers gone for a day are deleted by the next heartbeat of any worker.
"""
import logging
import threading

from django.db import connection

from webhooks import tracing
from webhooks.models import Heartbeat

WORKER_PREFIX = "worker:"
logger = logging.getLogger("herald.liveness")

_TABLE = Heartbeat._meta.db_table
_BEAT_SQL = f"""
WITH gone AS (
    DELETE FROM {_TABLE} WHERE name LIKE '{WORKER_PREFIX}%%' AND at < now() - interval '1 day'
)
INSERT INTO {_TABLE} AS h (name, at) VALUES (%(name)s, now())
ON CONFLICT (name) DO UPDATE SET at = now()
"""


def worker_name(hostname: str) -> str:
    return (WORKER_PREFIX + hostname)[:Heartbeat._meta.get_field("name").max_length]


class Heart:
    """Writes one worker's heartbeat when `beat()` is called (from the event loop), on a thread of its own."""

    def __init__(self, hostname: str) -> None:
        self.name = worker_name(hostname)
        self._due = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="herald-heartbeat", daemon=True)
        self._thread.start()

    def beat(self) -> None:
        self._due.set()

    def stop(self, wait: float = 0) -> None:
        """No more heartbeats (the row ages out: the worker is not consuming); waits up to `wait` seconds
        for a write under way."""
        self._stopped = True
        self._due.set()
        self._thread.join(wait)

    def _run(self) -> None:
        while True:
            self._due.wait()
            self._due.clear()
            if self._stopped:
                return
            try:
                with tracing.suppressed(), connection.cursor() as cursor:  # no trace every few seconds
                    cursor.execute(_BEAT_SQL, {"name": self.name})
            except Exception as exc:  # noqa: BLE001 - the next beat tries again; meanwhile the row ages
                logger.warning("liveness.heartbeat_failed", extra={"error": repr(exc)})
            finally:
                connection.close()  # this thread's connection (back to the worker's pool, if it has one)


def forget(hostname: str) -> None:
    """A worker shutting down: it is not live any more."""
    try:
        Heartbeat.objects.filter(name=worker_name(hostname)).delete()
    except Exception as exc:  # noqa: BLE001 - its row ages out instead
        logger.warning("liveness.forget_failed", extra={"error": repr(exc)})
