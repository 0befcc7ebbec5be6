"""Races on one key, proved with real concurrency: threads against gunicorn (2 processes) and PostgreSQL."""
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from django.db import connection

from intake.models import IdempotencyKey
from tests.conftest import other_session, wait_until
from tests.processes import free_port, gunicorn
from webhooks.models import Delivery, Event

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

EVENT = {"type": "invoice.paid", "data": {"invoice": "in_42"}}


@pytest.fixture
def server():
    """The API in two gunicorn processes with 25 threads each: 50 requests really run at once."""
    process = gunicorn(free_port(), workers=2, threads=25)
    yield process
    process.stop()


def _post(server, api, key, body=EVENT):
    return requests.post(f"{server.url}/api/v1/events", json=body, timeout=30,
                         headers={"Authorization": f"Bearer {api.token}", "Idempotency-Key": key})


class EventTableLock:
    """Hold a SHARE lock on the event table from another connection: event inserts wait on it.

    This makes a request slow in a real way (after it claimed its key, before it stores it),
    without any test hook in the code under test.
    """

    def __init__(self):
        self.conn = _connect()
        self.conn.execute("LOCK TABLE webhooks_event IN SHARE MODE")

    def release(self):
        self.conn.rollback()
        self.conn.close()


def _connect():
    return other_session(autocommit=False)


def _blocked_backends() -> list[tuple[int, int]]:
    """(backend pid, client port) of each connection whose statement waits on the event table lock."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid, client_port FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                       "AND datname = current_database() AND (query LIKE %s OR query LIKE %s)",
                       ["%webhooks_event%", "%herald_event_intake%"])  # the general path's insert, or the fast path's
        return cursor.fetchall()


def _wait_until_blocked(count=1):
    return wait_until(lambda: len(_blocked_backends()) >= count and _blocked_backends(), timeout=10,
                      message="the first request blocked on its event insert")


def _is_replay_of(response, first):
    return (response.status_code == first.status_code and response.content == first.content
            and response.headers.get("Idempotent-Replay") == "true")


def _is_in_progress(response):
    return (response.status_code == 409 and response.headers.get("Retry-After") == "2"
            and response.json()["code"] == "idempotency_key_in_progress")


def test_fifty_concurrent_identical_requests_execute_once(server, api, broker):
    # given two matching endpoints and one that does not match
    for url, types in (("https://a.example.com/", []), ("https://b.example.com/", ["invoice.*"]),
                       ("https://c.example.com/", ["customer.created"])):
        assert api.post("endpoints", {"url": url, "event_types": types}).status_code == 201
    barrier = threading.Barrier(50)

    def one(_):
        barrier.wait()
        return _post(server, api, "storm-key-000001")

    # when 50 clients send the same request at the same moment
    with ThreadPoolExecutor(50) as pool:
        responses = list(pool.map(one, range(50)))

    # then exactly one executed: one event, one delivery per matching endpoint, one enqueue each
    executed = [r for r in responses if r.status_code == 202 and "Idempotent-Replay" not in r.headers]
    assert len(executed) == 1
    first = executed[0]
    others = [r for r in responses if r is not first]
    assert all(_is_replay_of(r, first) or _is_in_progress(r) for r in others), {r.status_code for r in others}
    assert Event.objects.count() == 1
    deliveries = sorted(Delivery.objects.values_list("id", flat=True))
    assert len(deliveries) == 2
    assert sorted(d["id"] for d in first.json()["deliveries"]) == deliveries
    # published once: by a relay pass (broker.delivery_ids() runs one, as a worker's would, and returns once it
    # has published), and not again by the next pass
    wait_until(lambda: sorted(broker.delivery_ids()) == deliveries, timeout=20, message="the deliveries published")
    assert sorted(broker.delivery_ids()) == deliveries


def test_while_a_first_request_runs_a_retry_gets_409_at_once_and_another_request_the_mismatch(server, api):
    lock = EventTableLock()
    try:
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(_post, server, api, "slow-key-000001")
            _wait_until_blocked()  # the first request claimed the key and blocks on its insert
            assert not IdempotencyKey.objects.exists()  # a key is a row only once its request committed
            retry = _post(server, api, "slow-key-000001")
            # the fingerprint is compared before the in-progress state (SPEC §3), even with no row yet
            other = _post(server, api, "slow-key-000001", body={**EVENT, "data": {"invoice": "in_43"}})
            assert not slow.done(), "the first request should still be blocked"
            lock.release()
            lock = None
            first = slow.result(timeout=10)
    finally:
        if lock:
            lock.release()
    # "at once": answered while the first request was still blocked (checked above), not after it let go
    assert _is_in_progress(retry), retry.status_code
    assert other.status_code == 409 and other.json()["code"] == "idempotency_key_reused"
    assert first.status_code == 202
    assert _is_replay_of(_post(server, api, "slow-key-000001"), first)
    assert Event.objects.count() == 1


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return out


def _pid_owning_local_port(pids: list[int], port: int) -> int:
    """Which of these processes owns the TCP socket bound to 127.0.0.1:`port` (its PostgreSQL connection)."""
    inodes = {line.split()[9] for table in ("/proc/net/tcp", "/proc/net/tcp6")
              for line in Path(table).read_text().splitlines()[1:]
              if int(line.split()[1].rsplit(":", 1)[1], 16) == port}
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if any(os.readlink(fd) == f"socket:[{inode}]" for inode in inodes):
                    return pid
            except FileNotFoundError:
                pass
    raise AssertionError(f"no process of {pids} owns local port {port}")


def test_a_request_killed_while_it_waits_leaves_no_key_and_the_retry_executes_at_once(server, api):
    lock = EventTableLock()
    try:
        with ThreadPoolExecutor(1) as pool:
            doomed = pool.submit(_post, server, api, "killed-key-00001")
            ((backend, port),) = _wait_until_blocked()
            # the gunicorn worker serving it dies while its statement waits on the locked table
            worker = _pid_owning_local_port(_children(server.popen.pid), port)
            os.kill(worker, signal.SIGKILL)
            with pytest.raises(requests.ConnectionError):
                doomed.result(timeout=10)
            # the client retries at once, with the same key, while the table is still locked: it executes
            # (its statement then waits on the same lock as the first did)
            started = time.monotonic()
            retry = pool.submit(_post, server, api, "killed-key-00001")
            wait_until(lambda: any(pid != backend for pid, _ in _blocked_backends()) or retry.done(), timeout=10,
                       message="the retry executing")
            elapsed = time.monotonic() - started
            assert not retry.done(), retry.result().content  # not answered 409 in progress: it is executing
            lock.release()
            lock = None
            answer = retry.result(timeout=10)
    finally:
        if lock:
            lock.release()
    # "at once": executing (its statement waiting on the lock) while the table was still locked, and well before
    # the dead request's statement would have been cut by WEB_STATEMENT_TIMEOUT_SECONDS (5 s) had PostgreSQL not
    # noticed its connection gone (client_connection_check_interval: 10 ms)
    assert elapsed < 4
    assert answer.status_code == 202 and "Idempotent-Replay" not in answer.headers
    assert list(Event.objects.values_list("id", flat=True)) == [answer.json()["id"]]
    assert _is_replay_of(_post(server, api, "killed-key-00001"), answer)


class KeyRowLock:
    """Hold the row lock of one stored idempotency key from another connection (as a prune, or anything
    else writing the row, would)."""

    def __init__(self, key):
        self.conn = _connect()
        self.conn.execute("SELECT 1 FROM intake_idempotencykey WHERE key = %s FOR UPDATE", [key])

    def release(self):
        self.conn.rollback()
        self.conn.close()


def test_replays_are_reads_and_never_wait_for_the_key_row(server, api):
    first = _post(server, api, "read-key-0000001")
    assert first.status_code == 202
    lock = KeyRowLock("read-key-0000001")
    try:
        with ThreadPoolExecutor(10) as pool:
            started = time.monotonic()
            replays = list(pool.map(lambda _: _post(server, api, "read-key-0000001"), range(20)))
            elapsed = time.monotonic() - started
    finally:
        lock.release()
    assert all(_is_replay_of(r, first) for r in replays)
    # the row lock is held until after this: a replay that waited for it would never have answered
    assert elapsed < 20, f"20 replays took {elapsed:.2f} s behind a row lock"
    assert Event.objects.count() == 1
