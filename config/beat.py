"""Beat that can run on several hosts at once: only the holder of a PostgreSQL advisory lock ticks.

`celery -A config beat` uses LeaderScheduler (CELERY_BEAT_SCHEDULER). Each beat keeps a connection of
its own and tries `pg_try_advisory_lock` on it every second; the one that gets it sends the periodic
tasks, the others wait. The lock lives as long as that connection: when the ticking beat dies (or its
host, or its connection), PostgreSQL releases it and another beat takes over on its next try, within
about a second, so the dispatcher's next run is at most one interval plus a second late. A beat that
finds its connection broken stops ticking at once and competes again on a fresh one.
"""
from __future__ import annotations

import logging

import psycopg
from celery.beat import PersistentScheduler
from django.db import connections

logger = logging.getLogger("herald.beat")

# One key per deployment's database (advisory locks are per database): "herald-beat" as an int8.
BEAT_LOCK_KEY = int.from_bytes(b"herald-b", "big") & 0x7FFF_FFFF_FFFF_FFFF
RETRY_SECONDS = 1.0


class Leadership:
    """The advisory lock, held on a dedicated autocommit connection."""

    def __init__(self) -> None:
        self._conn: psycopg.Connection | None = None
        self.leading = False

    def _connect(self) -> psycopg.Connection:
        params = connections["default"].get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        from config.startup import worker_session_options

        # keepalives only: a lost beat host's lock is released once PostgreSQL notices it is gone
        params["options"] = worker_session_options(idle_in_transaction=False)
        return psycopg.connect(**params, autocommit=True, application_name="herald-beat")

    def check(self) -> bool:
        """Whether this beat leads now: keeps the lock it has, or tries to take it."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn, self.leading = self._connect(), False
            if self.leading:
                self._conn.execute("SELECT 1")  # the lock lives with the connection: is it still there?
            else:
                self.leading = self._conn.execute("SELECT pg_try_advisory_lock(%s)", [BEAT_LOCK_KEY]).fetchone()[0]
                if self.leading:
                    logger.info("beat.leading")
        except psycopg.Error as exc:
            if self.leading:
                logger.warning("beat.lost_leadership", extra={"error": repr(exc)})
            self.close()
        return self.leading

    def close(self) -> None:
        self.leading = False
        if self._conn is not None:
            try:
                self._conn.close()
            except psycopg.Error:
                pass
            self._conn = None


class LeaderScheduler(PersistentScheduler):
    """Celery's default scheduler, ticking only while this beat holds the lock (see the module doc)."""

    def __init__(self, *args, **kwargs):
        self.leadership = Leadership()
        super().__init__(*args, **kwargs)

    def tick(self, *args, **kwargs):
        if not self.leadership.check():
            return RETRY_SECONDS
        return min(super().tick(*args, **kwargs), RETRY_SECONDS)

    def close(self):
        self.leadership.close()
        super().close()

