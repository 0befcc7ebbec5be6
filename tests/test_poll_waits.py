"""Caps on waiting long-polls (SPEC §1 POLL_MAX_WAITS_*, §12) through real gunicorn processes sharing one
Redis: counted across processes, over a cap 429 `too_many_waits` with Retry-After at once, places freed
when a poll answers or its client hangs up (or, for a process that died, when they expire), and parked
polls never take the connection places other calls need."""
import os
import selectors
import signal
import socket
import threading
import time
import uuid

import pytest
import redis
import requests

from intake import waits
from tests.processes import free_port, gunicorn, warm
from webhooks.conf import herald_settings

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CAPS = {"POLL_MAX_WAITS_PER_CREDENTIAL": 3, "POLL_MAX_WAITS_PER_ENDPOINT": 2}


@pytest.fixture(scope="module")
def servers(django_db_setup, django_db_blocker):
    """Two API processes (two gunicorns, one worker and one thread each) with small caps, one Redis."""
    started = [gunicorn(free_port(), workers=1, threads=1, **CAPS) for _ in range(2)]
    try:
        yield [warm(process) for process in started]
    finally:
        for process in started:
            process.stop()


@pytest.fixture
def store():
    return redis.Redis.from_url(herald_settings.queues.REDIS_URL)


class Poller:
    def __init__(self, url: str, token: str):
        self.url = url
        self.token = token
        self.headers = {"Authorization": f"Bearer {token}"}

    def post(self, path, body):
        response = requests.post(f"{self.url}/api/v1/{path}", json=body, timeout=30,
                                 headers={**self.headers, "Idempotency-Key": f"key-{uuid.uuid4()}"})
        assert response.status_code in (201, 202), response.text
        return response.json()

    def messages(self, endpoint_id, **params):
        return requests.get(f"{self.url}/api/v1/endpoints/{endpoint_id}/messages", params=params,
                            headers=self.headers, timeout=60)

    def park(self, endpoint_id, wait=25):
        """A long-poll in a thread of the test; its answer in `out` once it has one."""
        out = {}

        def run():
            out["response"] = self.messages(endpoint_id, wait=wait)
            out["at"] = time.monotonic()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread, out

    def raw_park(self, endpoint_id, wait=25) -> socket.socket:
        """A long-poll on a socket of the test's own, to hang up on."""
        host, port = self.url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)))
        sock.sendall(f"GET /api/v1/endpoints/{endpoint_id}/messages?wait={wait} HTTP/1.1\r\nHost: {host}\r\n"
                     f"Authorization: Bearer {self.token}\r\n\r\n".encode())
        return sock


def _until(condition, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _waiting(store, endpoint_id) -> int:
    """The waits counted for an endpoint, across every process (what the caps are checked against)."""
    return store.zcount(f"{waits.KEY_PREFIX}endpoint:{endpoint_id}", "(" + str(int(time.time() * 1000)), "+inf")


def _assert_too_many_waits(response, started: float):
    assert response.status_code == 429, response.text
    assert response.headers["Content-Type"].startswith("application/problem+json")
    problem = response.json()
    assert problem["code"] == "too_many_waits" and problem["status"] == 429
    assert 1 <= int(response.headers["Retry-After"]) <= 30
    assert response.headers.get("Connection", "").lower() == "close"
    assert time.monotonic() - started < 5.0, "answered at once, not after a wait"


def test_the_caps_count_waits_parked_in_two_processes(servers, api, store):
    a, b = (Poller(server.url, api.token) for server in servers)
    first, second, third = (a.post("endpoints", {"kind": "poll", "event_types": [f"t{n}.*"]}) for n in range(3))
    polls = [a.park(first["id"]), b.park(first["id"])]
    _until(lambda: _waiting(store, first["id"]) == 2, what="two waits parked, one in each process")
    # the endpoint's cap (2) is full: a third wait on it, in either process, is refused at once
    for poller in (a, b):
        started = time.monotonic()
        _assert_too_many_waits(poller.messages(first["id"], wait=20), started)
    assert "POLL_MAX_WAITS_PER_ENDPOINT" in poller.messages(first["id"], wait=20).json()["detail"]
    # a poll without `wait`, or one with something to serve, never counts: answered as before
    assert a.messages(first["id"]).status_code == 200
    # the credential's cap (3): one more wait on another endpoint parks, the next is refused
    polls.append(b.park(second["id"]))
    _until(lambda: _waiting(store, second["id"]) == 1, what="the credential's third wait")
    started = time.monotonic()
    refused = a.messages(third["id"], wait=20)
    _assert_too_many_waits(refused, started)
    assert "POLL_MAX_WAITS_PER_CREDENTIAL" in refused.json()["detail"]
    assert not [out for _, out in polls if out], "a parked poll answered early"
    # when a message wakes the polls of the first endpoint, their places are free again
    a.post("events", {"type": "t0.created", "data": {}})
    for thread, out in polls[:2]:
        thread.join(10)
        assert out["response"].status_code == 200 and len(out["response"].json()["data"]) == 1
    _until(lambda: _waiting(store, first["id"]) == 0, what="the answered polls' places freed")
    thread, out = a.park(third["id"], wait=1)
    thread.join(10)
    assert out["response"].status_code == 200, out["response"].text


def test_another_credential_is_not_held_back_by_a_full_one(servers, api, other_api, store):
    mine, theirs = Poller(servers[0].url, api.token), Poller(servers[1].url, other_api.token)
    endpoints = [mine.post("endpoints", {"kind": "poll"}) for _ in range(2)]
    for endpoint in endpoints:
        for _ in range(2):
            mine.park(endpoint["id"])
    for endpoint in endpoints:
        _until(lambda: _waiting(store, endpoint["id"]) >= 1, what="waits parked")
    assert mine.messages(mine.post("endpoints", {"kind": "poll"})["id"], wait=20).status_code == 429
    # the other tenant's long-poll waits as usual (its own places) and its calls are answered at once
    own = theirs.post("endpoints", {"kind": "poll"})
    thread, out = theirs.park(own["id"], wait=1)
    thread.join(10)
    assert out["response"].status_code == 200
    started = time.monotonic()
    assert requests.get(f"{theirs.url}/api/v1/endpoints", headers=theirs.headers, timeout=10).status_code == 200
    assert time.monotonic() - started < 1.0


def test_a_client_that_hangs_up_frees_its_place(servers, api, store):
    a = Poller(servers[0].url, api.token)
    endpoint = a.post("endpoints", {"kind": "poll"})
    sockets = [a.raw_park(endpoint["id"]) for _ in range(2)]
    _until(lambda: _waiting(store, endpoint["id"]) == 2, what="two waits parked")
    assert a.messages(endpoint["id"], wait=20).status_code == 429
    for sock in sockets:
        sock.close()
    _until(lambda: _waiting(store, endpoint["id"]) == 0, what="the hung-up polls' places freed")
    thread, out = a.park(endpoint["id"], wait=1)
    thread.join(10)
    assert out["response"].status_code == 200


def test_the_places_of_a_process_that_died_expire(servers, api, store):
    # given two waits parked in a gunicorn that is then killed outright (no release can run)
    doomed = gunicorn(free_port(), workers=1, threads=1, **CAPS)
    try:
        warm(doomed)
        dying = Poller(doomed.url, api.token)
        endpoint = dying.post("endpoints", {"kind": "poll"})
        held = [dying.raw_park(endpoint["id"], wait=1) for _ in range(2)]   # kept open: no hang-up releases them
        _until(lambda: _waiting(store, endpoint["id"]) == 2, what="two waits parked")
        os.killpg(doomed.pgid, signal.SIGKILL)   # the master and its worker at once
    finally:
        doomed.stop()
    for sock in held:
        sock.close()
    # the endpoint is full for now, as far as the surviving process can tell...
    survivor = Poller(servers[0].url, api.token)
    started = time.monotonic()
    refused = survivor.messages(endpoint["id"], wait=20)
    _assert_too_many_waits(refused, started)
    # ...until the dead waits' deadline (1 s) and the margin have passed: they stop counting by themselves
    _until(lambda: _waiting(store, endpoint["id"]) == 0, timeout=1 + waits.EXPIRY_MARGIN_SECONDS + 5,
           what="the dead process's waits expired")
    thread, out = survivor.park(endpoint["id"], wait=1)
    thread.join(10)
    assert out["response"].status_code == 200, out["response"].text


def test_parked_polls_do_not_take_the_connection_places_of_other_calls(api, other_api):
    """gunicorn accepts no more connections once a worker holds `worker_connections`: parked polls must
    not count, or enough of them lock every other client out until they end."""
    server = warm(gunicorn(free_port(), workers=1, threads=1, args=("--worker-connections", "8"),
                           POLL_MAX_WAITS_PER_CREDENTIAL=50, POLL_MAX_WAITS_PER_ENDPOINT=50))
    try:
        poller = Poller(server.url, api.token)
        endpoint = poller.post("endpoints", {"kind": "poll"})
        sockets = [poller.raw_park(endpoint["id"], wait=20) for _ in range(12)]
        _until(lambda: _parked(server.url) == 12, what="12 polls parked, more than worker_connections")
        started = time.monotonic()
        health = requests.get(f"{server.url}/healthz", timeout=15)
        listed = requests.get(f"{server.url}/api/v1/endpoints", timeout=15,
                              headers={"Authorization": f"Bearer {other_api.token}"})
        assert health.status_code == 200 and listed.status_code == 200
        assert time.monotonic() - started < 2.0, time.monotonic() - started
        for sock in sockets:
            sock.close()
        _until(lambda: _parked(server.url) == 0, what="the hung-up polls gone from the gauge")
    finally:
        server.stop()


def _parked(url: str) -> int:
    for line in requests.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("herald_polls_parked"):
            return int(float(line.split()[-1]))
    return -1


def test_a_credential_flooding_the_worker_does_not_delay_another_s_calls(api, other_api):
    """Whole requests wait for a thread in turns by credential: 400 long-polls sent at once by one credential
    (all but its 3 places answered 429) do not queue another credential's call behind them. The moment each
    flood answer arrives is taken as it arrives (a reader on every socket), so the order is what the server
    did, whatever this machine's speed: first come, first served would answer the flood still waiting when
    the other call was sent before that call; turns by credential answer it next."""
    server = warm(gunicorn(free_port(), workers=1, threads=1, **CAPS))
    host, port = server.url.removeprefix("http://").split(":")
    try:
        flooder, other = Poller(server.url, api.token), Poller(server.url, other_api.token)
        endpoint = flooder.post("endpoints", {"kind": "poll"})
        sockets = [socket.create_connection((host, int(port))) for _ in range(400)]
        request = (f"GET /api/v1/endpoints/{endpoint['id']}/messages?wait=20 HTTP/1.1\r\nHost: {host}\r\n"
                   f"Authorization: Bearer {flooder.token}\r\n\r\n").encode()
        other_sock = socket.create_connection((host, int(port)))
        arrived: dict[socket.socket, float] = {}
        selector = selectors.DefaultSelector()
        for sock in sockets:
            selector.register(sock, selectors.EVENT_READ)

        def read_flood():
            deadline = time.monotonic() + 30
            while len(arrived) < len(sockets) - CAPS["POLL_MAX_WAITS_PER_CREDENTIAL"] and time.monotonic() < deadline:
                for key, _ in selector.select(timeout=0.5):
                    arrived[key.fileobj] = time.monotonic()
                    selector.unregister(key.fileobj)

        reader = threading.Thread(target=read_flood)
        reader.start()
        for sock in sockets:
            sock.sendall(request)
        sent = time.monotonic()
        other_sock.sendall(f"GET /api/v1/endpoints HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer "
                           f"{other.token}\r\nConnection: close\r\n\r\n".encode())
        other_sock.settimeout(30)
        head = other_sock.recv(12)
        answered = time.monotonic()
        reader.join(35)
        assert head.startswith(b"HTTP/1.1 200"), head
        still_waiting = sum(1 for sock in sockets if arrived.get(sock, float("inf")) > sent)
        after_it = sum(1 for sock in sockets if arrived.get(sock, float("inf")) > answered)
        # the flood had made a backlog when the other call was sent (else this proves nothing)
        assert still_waiting >= 100, (still_waiting, "of the flood unanswered when the other call was sent")
        assert after_it >= still_waiting // 2, (after_it, still_waiting, round(answered - sent, 3))
        for sock in [*sockets, other_sock]:
            sock.close()
    finally:
        server.stop()
