"""Django's PostgreSQL backend with a health check that costs no round trip.

With CONN_HEALTH_CHECKS, Django checks a reused connection before the first query of every request,
by sending `SELECT 1`: a round trip per API call, half the database work of a replay (which is
otherwise one read). This check asks the kernel instead: a connection between two requests has
nothing to read, while one that PostgreSQL closed (a restart, an idle or terminated backend) has its
end of file, and usually its last error, waiting on the socket. A connection found that way is closed
and the request opens a new one, as with Django's own check.

`atomic_begun_by_first_statement()` is `transaction.atomic()` whose BEGIN travels with the block's
first statement (`take_begin()` hands it over): psycopg opens a transaction with a BEGIN round trip
of its own before the first statement, which the intake's transaction (intake/idempotency/store.py)
does not need to pay; its COMMIT travels with its last statement in the same way.
"""
import select
from contextlib import contextmanager

from django.db import transaction
from django.db.backends.postgresql import base


class DatabaseWrapper(base.DatabaseWrapper):
    _begin_by_statement = False  # set while atomic_begun_by_first_statement() opens its block
    _begin_pending = False  # the block is open, its BEGIN not sent yet

    @contextmanager
    def atomic_begun_by_first_statement(self):
        """transaction.atomic() (outermost) whose first statement must start with `take_begin()`."""
        self._begin_by_statement = True
        try:
            with transaction.atomic(using=self.alias):
                self._begin_by_statement = False
                yield
        finally:
            self._begin_by_statement = self._begin_pending = False

    def take_begin(self) -> str:
        """"BEGIN;" for the first statement of an atomic_begun_by_first_statement() block, else ""."""
        pending, self._begin_pending = self._begin_pending, False
        return "BEGIN;" if pending else ""

    def _set_autocommit(self, autocommit):
        if not autocommit and self._begin_by_statement:
            # psycopg stays in autocommit, so it sends no BEGIN of its own; the block's first statement
            # carries it. COMMIT and ROLLBACK are sent by Django and psycopg as for any block.
            self._begin_pending = True
            return
        super()._set_autocommit(autocommit)

    def is_usable(self) -> bool:
        conn = self.connection
        if conn is None or conn.closed or conn.broken:
            return False
        try:
            poller = select.poll()  # not select(): a web worker's descriptors may number over 1,024
            poller.register(conn.pgconn.socket, select.POLLIN)
            return not poller.poll(0)
        except (OSError, ValueError, conn.OperationalError):  # the socket is gone
            return False
