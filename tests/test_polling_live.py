"""Long-polls of poll endpoints through real gunicorn (gunicorn.conf.py's worker), PostgreSQL's
LISTEN/NOTIFY and real clients: a wait holds no thread, wakes promptly when a message arrives, ends with
an empty page at its deadline, and survives the loss of the worker's listener connection."""
import threading
import time
import uuid

import pytest
import requests
from django.db import connection

from tests.processes import free_port, gunicorn

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    """One gunicorn worker with ONE thread: anything a waiting long-poll held would stop every other call."""
    process = gunicorn(free_port(), workers=1, threads=1)
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
    assert 1.4 <= elapsed < 3.0, elapsed
    # without wait: at once
    started = time.monotonic()
    assert caller.messages(endpoint["id"]).json()["data"] == []
    assert time.monotonic() - started < 1.0


def test_waiting_long_polls_hold_no_thread_and_all_wake_when_their_message_arrives(caller):
    # given 30 long-polls waiting on one worker that has a single thread, on three endpoints
    endpoints = [caller.post("endpoints", {"kind": "poll", "event_types": [f"t{n}.*"]}) for n in range(3)]
    polls = [(endpoint, *_in_thread(caller.messages, endpoint["id"], wait=25))
             for endpoint in endpoints for _ in range(10)]
    time.sleep(1.0)
    assert not [out for _, _, out in polls if out], "a long-poll answered before anything was posted"
    # when other calls are made meanwhile, they are served at once (no thread is held by the waits)
    started = time.monotonic()
    listed = caller.session.get(f"{caller.url}/api/v1/endpoints", timeout=10)
    assert listed.status_code == 200 and time.monotonic() - started < 1.0
    # and an event for the first endpoint wakes its ten polls, promptly, and only those
    posted_at = time.monotonic()
    event = caller.post("events", {"type": "t0.created", "data": {"n": 1}})
    for endpoint, thread, out in polls[:10]:
        thread.join(10)
        assert out["response"].status_code == 200
        assert [m["headers"]["webhook-id"] for m in out["response"].json()["data"]] == [event["id"]]
        assert out["at"] - posted_at < 1.0, out["at"] - posted_at
    time.sleep(0.5)
    assert not [out for _, _, out in polls[10:] if out]
    caller.post("events", {"type": "t1.created", "data": {}})
    caller.post("events", {"type": "t2.created", "data": {}})
    for endpoint, thread, out in polls[10:]:
        thread.join(10)
        assert len(out["response"].json()["data"]) == 1


def test_a_poll_woken_by_its_message_is_acknowledged_by_its_next_read(caller, api):
    endpoint = caller.post("endpoints", {"kind": "poll"})
    thread, out = _in_thread(caller.messages, endpoint["id"], wait=20)
    time.sleep(0.3)
    event = caller.post("events", {"type": "invoice.paid", "data": {}})
    thread.join(10)
    page = out["response"].json()
    delivery_id = page["data"][0]["delivery_id"]
    # the next read, from its cursor, waits (nothing new) and has acknowledged it already
    thread, out = _in_thread(caller.messages, endpoint["id"], after=page["next_cursor"], wait=3)
    time.sleep(0.5)
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
        sock.sendall(f"GET /api/v1/endpoints/{endpoint['id']}/messages?wait=20 HTTP/1.1\r\nHost: {host}\r\n"
                     f"Authorization: {caller.session.headers['Authorization']}\r\n\r\n".encode())
        time.sleep(0.2)
        sock.close()
    thread, out = _in_thread(caller.messages, endpoint["id"], wait=10)
    time.sleep(0.3)
    caller.post("events", {"type": "invoice.paid", "data": {}})
    thread.join(10)
    assert len(out["response"].json()["data"]) == 1 and out["elapsed"] < 5


def test_a_lost_listener_connection_delays_a_wake_by_a_second_at_most(caller):
    endpoint = caller.post("endpoints", {"kind": "poll"})
    thread, out = _in_thread(caller.messages, endpoint["id"], wait=20)
    time.sleep(0.5)
    # when PostgreSQL ends the worker's LISTEN connection
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE datname = current_database() AND query LIKE 'LISTEN%%'")
        assert cursor.fetchall(), "no LISTEN connection found"
    time.sleep(0.5)
    posted_at = time.monotonic()
    caller.post("events", {"type": "invoice.paid", "data": {}})
    thread.join(10)
    assert len(out["response"].json()["data"]) == 1
    assert out["at"] - posted_at < 2.0
    # and the listener comes back: the next wait is woken by its NOTIFY again
    time.sleep(3)
    page = out["response"].json()
    thread, out = _in_thread(caller.messages, endpoint["id"], after=page["next_cursor"], wait=20)
    time.sleep(1.5)
    posted_at = time.monotonic()
    caller.post("events", {"type": "invoice.paid", "data": {}})
    thread.join(10)
    assert len(out["response"].json()["data"]) == 1 and out["at"] - posted_at < 1.0


def test_a_stopping_worker_answers_its_waiting_long_polls_at_once(api):
    # given a long-poll waiting in a gunicorn of its own
    process = gunicorn(free_port(), workers=1, threads=1)
    try:
        caller = Caller(process.url, api.token)
        endpoint = caller.post("endpoints", {"kind": "poll"})
        thread, out = _in_thread(caller.messages, endpoint["id"], wait=25)
        time.sleep(0.5)
        # when gunicorn is told to stop, the wait is answered (an empty page), not cut off nor waited out
        stopped_at = time.monotonic()
        process.stop()
        thread.join(15)
        assert out["response"].status_code == 200 and out["response"].json()["data"] == []
        assert out["at"] - stopped_at < 3.0
    finally:
        process.stop()
