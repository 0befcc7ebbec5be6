"""Long-polls of poll endpoints through real gunicorn (gunicorn.conf.py's worker), PostgreSQL's
LISTEN/NOTIFY and real clients: a wait holds no thread, wakes promptly when a message arrives, ends with
an empty page at its deadline, and survives the loss of the worker's listener connection."""
import signal
import threading
import time
import uuid

import pytest
import requests
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import wait_until
from tests.processes import free_port, gunicorn

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    """One gunicorn worker with ONE thread: anything a waiting long-poll held would stop every other call.
    Its caps on waiting long-polls are raised above the 30 these tests park at once (tests/test_poll_waits.py
    tests the caps)."""
    process = gunicorn(free_port(), workers=1, threads=1, POLL_MAX_WAITS_PER_CREDENTIAL=100,
                       POLL_MAX_WAITS_PER_ENDPOINT=100)
    try:
        yield process
    finally:
        process.stop()


class Caller:
    def __init__(self, url: str, token: str):
        self.url = url
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def post(self, path, body):
        response = self.session.post(f"{self.url}/api/v1/{path}", json=body, timeout=30,
                                     headers={"Idempotency-Key": f"key-{uuid.uuid4()}"})
        assert response.status_code in (201, 202), response.text
        return response.json()

    def messages(self, endpoint_id, **params):
        # a session of its own: requests.Session is not for several threads at once
        with requests.Session() as session:
            session.headers.update(self.session.headers)
            return session.get(f"{self.url}/api/v1/endpoints/{endpoint_id}/messages", params=params, timeout=60)


@pytest.fixture
def caller(server, api):
    return Caller(server.url, api.token)


def _gauge(url: str, name: str) -> float:
    """A gauge of the worker's /metrics (one worker here: its own parked polls and listener)."""
    text = requests.get(f"{url}/metrics", timeout=10).text
    return next(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
                if sample.name == name)


def parked(url: str, count: int, listener: int | None = None) -> None:
    """Wait until the worker holds `count` long-polls parked (and its listener is up or down, if given)."""
    def reached():
        return _gauge(url, "herald_long_polls_parked") == count and (
            listener is None or _gauge(url, "herald_long_poll_listener_up") == listener)
    wait_until(reached, timeout=20, interval=0.05,
               message=f"{count} long-polls parked" + ("" if listener is None else f", listener up={listener}"))


def _in_thread(fn, *args, **kwargs):
    out = {}

    def run():
        started = time.monotonic()
        out["response"] = fn(*args, **kwargs)
        out["elapsed"] = time.monotonic() - started
        out["at"] = time.monotonic()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_a_long_poll_with_nothing_to_serve_answers_an_empty_page_at_its_deadline(caller):
    endpoint = caller.post("endpoints", {"kind": "poll"})
    started = time.monotonic()
    response = caller.messages(endpoint["id"], wait=1.5)
    elapsed = time.monotonic() - started
    assert response.status_code == 200 and response.json() == {"data": [], "next_cursor": "0"}
    assert 1.4 <= elapsed < 10, elapsed  # its deadline, not sooner (the upper bound: not stuck)
    # without wait: at once (nothing parked it)
    assert caller.messages(endpoint["id"]).json()["data"] == []
    parked(caller.url, 0)


def test_waiting_long_polls_hold_no_thread_and_all_wake_when_their_message_arrives(caller):
    # given 30 long-polls waiting on one worker that has a single thread, on three endpoints
    endpoints = [caller.post("endpoints", {"kind": "poll", "event_types": [f"t{n}.*"]}) for n in range(3)]
    polls = [(endpoint, *_in_thread(caller.messages, endpoint["id"], wait=30))
             for endpoint in endpoints for _ in range(10)]
    parked(caller.url, 30)  # /metrics: the worker holds all 30 parked
    assert not [out for _, _, out in polls if out], "a long-poll answered before anything was posted"
    # when other calls are made meanwhile, they are served (no thread is held by the waits: a held one would
    # keep this call waiting for the polls' 30 s deadline, past its 10 s timeout)
    listed = caller.session.get(f"{caller.url}/api/v1/endpoints", timeout=10)
    assert listed.status_code == 200
    # and an event for the first endpoint wakes its ten polls, long before their deadline, and only those
    posted_at = time.monotonic()
    event = caller.post("events", {"type": "t0.created", "data": {"n": 1}})
    for endpoint, thread, out in polls[:10]:
        thread.join(60)
        assert out["response"].status_code == 200
        assert [m["headers"]["webhook-id"] for m in out["response"].json()["data"]] == [event["id"]]
        assert out["at"] - posted_at < 20, out["at"] - posted_at
    parked(caller.url, 20)  # the other twenty still wait
    assert not [out for _, _, out in polls[10:] if out]
    caller.post("events", {"type": "t1.created", "data": {}})
    caller.post("events", {"type": "t2.created", "data": {}})
    for endpoint, thread, out in polls[10:]:
        thread.join(60)
        assert len(out["response"].json()["data"]) == 1


def test_a_poll_woken_by_its_message_is_acknowledged_by_its_next_read(caller, api):
    endpoint = caller.post("endpoints", {"kind": "poll"})
    thread, out = _in_thread(caller.messages, endpoint["id"], wait=30)
    parked(caller.url, 1)
    event = caller.post("events", {"type": "invoice.paid", "data": {}})
    thread.join(60)
    page = out["response"].json()
    delivery_id = page["data"][0]["delivery_id"]
    # the next read, from its cursor, waits (nothing new) and has acknowledged it already
    thread, out = _in_thread(caller.messages, endpoint["id"], after=page["next_cursor"], wait=3)
    parked(caller.url, 1)
    shown = caller.session.get(f"{caller.url}/api/v1/deliveries/{delivery_id}", timeout=10).json()
    assert shown["status"] == "succeeded" and shown["event_id"] == event["id"]
    thread.join(10)
    assert out["response"].json() == {"data": [], "next_cursor": page["next_cursor"]}


def test_a_client_that_hangs_up_while_waiting_is_dropped_and_the_worker_serves_on(caller):
    import socket

    endpoint = caller.post("endpoints", {"kind": "poll"})
    host, port = caller.url.removeprefix("http://").split(":")
    for _ in range(5):
        sock = socket.create_connection((host, int(port)))
        sock.sendall(f"GET /api/v1/endpoints/{endpoint['id']}/messages?wait=30 HTTP/1.1\r\nHost: {host}\r\n"
                     f"Authorization: {caller.session.headers['Authorization']}\r\n\r\n".encode())
        parked(caller.url, 1)
        sock.close()
        parked(caller.url, 0)  # dropped as soon as it hung up, not kept until its deadline
    thread, out = _in_thread(caller.messages, endpoint["id"], wait=30)
    parked(caller.url, 1)
    caller.post("events", {"type": "invoice.paid", "data": {}})
    thread.join(60)
    assert len(out["response"].json()["data"]) == 1 and out["elapsed"] < 20  # woken, not at its deadline


def test_a_lost_listener_connection_delays_a_wake_but_loses_none(caller):
    """While the listener is down a parked poll looks again every LISTENER_DOWN_RECHECK_SECONDS (1 s): its wake
    comes late by that much at most, never at its deadline. The bounds below keep a wide margin for a loaded
    machine and stay far below the 30 s deadline a lost wake would wait for."""
    endpoint = caller.post("endpoints", {"kind": "poll"})
    thread, out = _in_thread(caller.messages, endpoint["id"], wait=30)
    parked(caller.url, 1, listener=1)
    # when PostgreSQL ends the worker's LISTEN connection
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND query LIKE 'LISTEN%%'")
        ended = [row[0] for row in cursor.fetchall()]
        assert ended, "no LISTEN connection found"
    # the worker noticed (a message now can come by no NOTIFY); unless it listens again already
    wait_until(lambda: _gauge(caller.url, "herald_long_poll_listener_up") == 0 or _relistened(ended),
               timeout=15, message="the worker noticing its listener is gone")
    posted_at = time.monotonic()
    caller.post("events", {"type": "invoice.paid", "data": {}})
    thread.join(60)
    assert len(out["response"].json()["data"]) == 1
    assert out["at"] - posted_at < 20
    # and the listener comes back: the next wait is woken by its NOTIFY again
    page = out["response"].json()
    thread, out = _in_thread(caller.messages, endpoint["id"], after=page["next_cursor"], wait=30)
    parked(caller.url, 1, listener=1)
    posted_at = time.monotonic()
    caller.post("events", {"type": "invoice.paid", "data": {}})
    thread.join(60)
    assert len(out["response"].json()["data"]) == 1 and out["at"] - posted_at < 20


def _relistened(ended: list[int]) -> bool:
    """A new LISTEN connection is up already (the worker reconnects LISTENER_RETRY_SECONDS after a loss)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND query LIKE 'LISTEN%%' AND NOT pid = ANY(%s)", [ended])
        return cursor.fetchone()[0] > 0


def test_a_stopping_worker_answers_its_waiting_long_polls_at_once(api):
    # given a long-poll waiting in a gunicorn of its own
    process = gunicorn(free_port(), workers=1, threads=1)
    try:
        caller = Caller(process.url, api.token)
        endpoint = caller.post("endpoints", {"kind": "poll"})
        thread, out = _in_thread(caller.messages, endpoint["id"], wait=30)
        parked(process.url, 1)
        # when gunicorn is told to stop, the wait is answered (an empty page), not cut off nor waited out
        # (waited out, it would be cut off by the stop's SIGKILL: no 200)
        stopped_at = time.monotonic()
        process.stop(sig=signal.SIGTERM)  # gunicorn's graceful shutdown (tests stop it quickly otherwise)
        thread.join(60)
        assert out["response"].status_code == 200 and out["response"].json()["data"] == []
        assert out["at"] - stopped_at < 10  # within the stop's grace
    finally:
        process.stop()
