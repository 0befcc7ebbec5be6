"""A worker's or beat's PostgreSQL session ends when its host is lost (config/startup.py), so the locks it held
stop holding the others back. The host itself being cut off is the black-box scenario `hosts`."""
import time

import psycopg
import pytest
from django.db import connection

from config.startup import DEAD_PEER_KEEPALIVES, worker_session_options

pytestmark = pytest.mark.django_db(transaction=True)


def _connect(options: str) -> psycopg.Connection:
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params["options"] = options
    return psycopg.connect(**params, autocommit=True)


def test_a_session_left_idle_in_a_transaction_ends_and_its_locks_go(settings):
    settings.WORKER_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS = 1
    lost = _connect(worker_session_options())
    with _connect("") as other:
        other.execute("CREATE TABLE herald_test_locked (id int PRIMARY KEY)")
        other.execute("INSERT INTO herald_test_locked VALUES (1)")
        try:
            # a worker whose host vanished between two statements, holding a row lock (as a record holds its
            # endpoint's)
            lost.execute("BEGIN")
            lost.execute("SELECT * FROM herald_test_locked WHERE id = 1 FOR UPDATE")
            started = time.monotonic()
            other.execute("SET lock_timeout = '20s'")
            other.execute("SELECT * FROM herald_test_locked WHERE id = 1 FOR UPDATE")  # waits for the lock to go
            waited = time.monotonic() - started
            assert 0.5 < waited < 15, waited
            with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
                lost.execute("SELECT 1")  # PostgreSQL ended the lost session
        finally:
            lost.close()
            other.execute("DROP TABLE herald_test_locked")


def test_every_worker_and_beat_session_sends_keepalives(settings):
    settings.WORKER_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS = 7
    with _connect(worker_session_options()) as session:
        shown = {name: session.execute(f"SHOW {name}").fetchone()[0] for name in
                 [*DEAD_PEER_KEEPALIVES, "idle_in_transaction_session_timeout"]}
    assert shown == {"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "2", "tcp_keepalives_count": "3",
                     "tcp_user_timeout": "11000", "idle_in_transaction_session_timeout": "7s"}
    with _connect(worker_session_options(idle_in_transaction=False)) as lock_session:  # beat's leadership lock
        assert lock_session.execute("SHOW idle_in_transaction_session_timeout").fetchone()[0] == "0"
        assert lock_session.execute("SHOW tcp_keepalives_idle").fetchone()[0] == "5"
