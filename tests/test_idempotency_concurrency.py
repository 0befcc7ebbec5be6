"""Races on one key, proved with real concurrency: threads against gunicorn (2 processes) and PostgreSQL."""
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
import requests
from django.db import connection

from intake.models import IdempotencyKey
from tests.conftest import wait_until
from tests.processes import free_port, gunicorn
from webhooks.models import Delivery, Event

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

EVENT = {"type": "invoice.paid", "data": {"invoice": "in_42"}}


@pytest.fixture
def server():
    """The API in two gunicorn processes with 25 threads each: 50 requests really run at once."""
    process = gunicorn(free_port(), workers=2, threads=25, IDEMPOTENCY_LOCK_TIMEOUT_SECONDS=1)
    yield process
    process.stop()


def _post(server, api, key, body=EVENT):
    return requests.post(f"{server.url}/api/v1/events", json=body, timeout=30,
                         headers={"Authorization": f"Bearer {api.token}", "Idempotency-Key": key})


class EventTableLock:
    """Hold a SHARE lock on the event table from another connection: event inserts wait on it.

    This makes a request slow in a real way (after it took its key, before it completes it),
    without any test hook in the code under test.
    """

    def __init__(self):
        params = connection.get_connection_params()
        self.conn = psycopg.connect(dbname=params["dbname"], host=params.get("host"), port=params.get("port"),
                                    user=params.get("user"))
        self.conn.execute("LOCK TABLE webhooks_event IN SHARE MODE")

    def release(self):
        self.conn.rollback()
        self.conn.close()


def _wait_for_key(key):
    return wait_until(lambda: IdempotencyKey.objects.filter(key=key, status="in_progress").first(),
                      timeout=10, message=f"key {key} taken")


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
    # published by the server's background publisher, once
    wait_until(lambda: sorted(broker.delivery_ids()) == deliveries, timeout=5, message="the deliveries published")
    time.sleep(0.5)
    assert sorted(broker.delivery_ids()) == deliveries


def test_a_retry_during_a_slow_first_request_gets_409_at_once(server, api):
    lock = EventTableLock()
    try:
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(_post, server, api, "slow-key-000001")
            _wait_for_key("slow-key-000001")  # the first request took the key and blocks on its insert
            started = time.monotonic()
            retry = _post(server, api, "slow-key-000001")
            elapsed = time.monotonic() - started
            assert _is_in_progress(retry)
            assert elapsed < 1.0
            assert not slow.done(), "the first request should still be blocked"
            lock.release()
            lock = None
            first = slow.result(timeout=10)
    finally:
        if lock:
            lock.release()
    assert first.status_code == 202
    assert _is_replay_of(_post(server, api, "slow-key-000001"), first)
    assert Event.objects.count() == 1


def test_a_stale_key_is_taken_over_by_exactly_one_retry_and_the_original_rolls_back(server, api):
    # the server runs with IDEMPOTENCY_LOCK_TIMEOUT_SECONDS=1
    lock = EventTableLock()
    try:
        with ThreadPoolExecutor(8) as pool:
            # the original takes the key, then hangs on its event insert past the lock timeout
            original = pool.submit(_post, server, api, "stale-key-000001")
            key = _wait_for_key("stale-key-000001")
            time.sleep(max(0.0, 1.2 - (time.time() - key.locked_at.timestamp())))
            barrier = threading.Barrier(5)

            def retry():
                barrier.wait()
                return _post(server, api, "stale-key-000001")

            retries = [pool.submit(retry) for _ in range(5)]
            # four are turned away at once; the one that took over hangs on the same lock
            deadline = time.monotonic() + 10
            while sum(f.done() for f in retries) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            done = [f.result() for f in retries if f.done()]
            assert len(done) == 4 and all(_is_in_progress(r) for r in done)
            assert not original.done()
            lock.release()
            lock = None
            winner_response = next(f for f in retries if not f.done() or f.result() not in done).result(timeout=10)
            original_response = original.result(timeout=10)
    finally:
        if lock:
            lock.release()
    assert winner_response.status_code == 202
    # the original lost its lock: it cannot complete, and its work rolled back
    assert _is_in_progress(original_response)
    assert list(Event.objects.values_list("id", flat=True)) == [winner_response.json()["id"]]
    assert _is_replay_of(_post(server, api, "stale-key-000001"), winner_response)


class KeyRowLock:
    """Hold the row lock of one idempotency key from another connection, as the transaction that
    completes it does between its UPDATE and its COMMIT (the view's work can take that long)."""

    def __init__(self, key):
        params = connection.get_connection_params()
        self.conn = psycopg.connect(dbname=params["dbname"], host=params.get("host"), port=params.get("port"),
                                    user=params.get("user"))
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
    assert elapsed < 2.0, f"20 replays took {elapsed:.2f} s behind a row lock"
    assert Event.objects.count() == 1


def test_a_retry_while_the_original_completes_gets_409_at_once(server, api):
    lock = EventTableLock()
    key_lock = None
    try:
        with ThreadPoolExecutor(1) as pool:
            slow = pool.submit(_post, server, api, "done-key-0000001")
            _wait_for_key("done-key-0000001")
            key_lock = KeyRowLock("done-key-0000001")  # as if the original were completing it now
            started = time.monotonic()
            retry = _post(server, api, "done-key-0000001")
            elapsed = time.monotonic() - started
            key_lock.release()
            key_lock = None
            lock.release()
            lock = None
            first = slow.result(timeout=10)
    finally:
        for held in (key_lock, lock):
            if held:
                held.release()
    assert _is_in_progress(retry) and elapsed < 1.0, (retry.status_code, elapsed)
    assert first.status_code == 202
    assert _is_replay_of(_post(server, api, "done-key-0000001"), first)
