"""Slow and abusive clients against the API as `gunicorn config.wsgi` starts it (gunicorn.conf.py's worker):
trickled heads and bodies hold no thread and are cut, oversized requests are refused at once, nothing is stored."""
import re
import socket
import time
import uuid

import pytest
import requests

from blackbox.slowclients import Probe, all_opened, body_tricklers, exchange, header_tricklers
from intake.models import IdempotencyKey
from tests.conftest import make_api
from tests.processes import free_port, gunicorn, run_dir, warm
from webhooks.models import Event

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CLIENT_TIMEOUT = 2.0
EVENT = b'{"type": "invoice.paid", "data": {"invoice": "in_1"}}'


@pytest.fixture
def api():
    return make_api("acme")


def _start(processes, *args):
    """The API with gunicorn.conf.py's own workers and threads (2 x 4), as the README starts it."""
    return warm(processes(gunicorn(free_port(), workers=None, threads=None, args=args,
                                   WEB_CLIENT_TIMEOUT_SECONDS=CLIENT_TIMEOUT,
                                   PROMETHEUS_MULTIPROC_DIR=run_dir("metrics"))))   # /metrics sums both workers


def _port(server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def _probe(server, api, seconds: float, timeout: float = 5) -> Probe:
    """Normal requests one after another for `seconds`: a health check and a real intake POST in turn."""
    probe, deadline = Probe(), time.monotonic() + seconds
    headers = {"Authorization": f"Bearer {api.token}", "Content-Type": "application/json"}
    while time.monotonic() < deadline:
        started = time.monotonic()
        try:
            if len(probe.seconds) % 2:
                response = requests.post(f"{server.url}/api/v1/events", data=EVENT, timeout=timeout,
                                         headers={**headers, "Idempotency-Key": f"probe-{uuid.uuid4()}"})
                assert response.status_code == 202, response.text
            else:
                assert requests.get(f"{server.url}/healthz", timeout=timeout).status_code == 200
        except requests.RequestException as exc:
            probe.failures.append(repr(exc))
        probe.seconds.append(time.monotonic() - started)
        time.sleep(0.05)   # the input: the probe's pace
    return probe


def _attack(server, count: int):
    host, port = "127.0.0.1", _port(server)
    tricklers = header_tricklers(host, port, count, interval=0.5) + body_tricklers(host, port, count, interval=0.5)
    for trickler in tricklers:
        trickler.start()
    all_opened(tricklers)   # every connection has sent its first bytes
    return tricklers


def test_fifty_trickled_heads_and_fifty_trickled_bodies_do_not_stall_the_api(processes, api):
    server = _start(processes)
    tricklers = _attack(server, 50)
    probe = _probe(server, api, seconds=CLIENT_TIMEOUT + 1)
    for trickler in tricklers:
        trickler.join(CLIENT_TIMEOUT + 3)
    assert probe.failures == []
    assert len(probe.seconds) >= 10 and probe.p(0.99) < 1.0, probe.seconds
    # every slow connection was answered 408 and cut within the bound (the check runs every second)
    results = [trickler.result for trickler in tricklers]
    assert [r.status for r in results] == [408] * 100, [(r.status, r.error) for r in results]
    assert all(CLIENT_TIMEOUT - 0.1 <= r.cut_after <= CLIENT_TIMEOUT + 1.5 for r in results), \
        sorted(r.cut_after for r in results)
    assert Event.objects.count() == len(probe.seconds) // 2   # only the probe's events: none of the attack's
    assert "Refused 408 from 127.0.0.1" in server.output()


def test_plain_gthread_is_stalled_by_the_same_attack(processes, api):
    """The control: with gunicorn's own gthread worker, 8 trickling connections take every thread."""
    server = _start(processes, "--worker-class", "gthread")
    tricklers = _attack(server, 50)
    probe = _probe(server, api, seconds=3, timeout=2)
    for trickler in tricklers:
        trickler.stop()
    assert probe.failures, probe.seconds


def test_odd_requests_are_refused_at_once_with_a_problem_and_store_nothing(processes, api):
    server = _start(processes)
    host, port = "127.0.0.1", _port(server)
    auth = b"Authorization: Bearer %s\r\nIdempotency-Key: odd-%s\r\n" % (api.token.encode(), uuid.uuid4().hex.encode())

    big_head = exchange(host, port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 17_000 + b"\r\n\r\n")
    many_headers = exchange(host, port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
                            b"".join(b"X-%d: v\r\n" % i for i in range(10_000)) + b"\r\n")
    gigabyte = exchange(host, port, b"POST /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth +
                        b"Content-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n")
    # a chunk's size is llhttp's to read, not ours: an oversized chunk is refused once the bytes over the limit arrive
    big_chunk = exchange(host, port, b"POST /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth +
                         b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n{" % 300_000 +
                         b" " * 299_999)
    # a client that sends an oversized body straight after its head, without waiting, still reads the 413
    blasted = exchange(host, port, b"POST /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth +
                       b"Content-Type: application/json\r\nContent-Length: 300000\r\n\r\n{" + b" " * 299_998 + b"}")
    for answer in (big_head, many_headers, gigabyte, big_chunk, blasted):
        assert answer.seconds < 1.0, answer
    assert [a.status for a in (big_head, many_headers, gigabyte, big_chunk, blasted)] == [431, 431, 413, 413, 413]
    assert b"Content-Type: application/problem+json" in gigabyte.head and b"Connection: close" in gigabyte.head

    # a body sent one byte per second: 408 once the request is CLIENT_TIMEOUT old, whatever it still sends
    one_byte = exchange(host, port, b"POST /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth +
                        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(EVENT),
                        then=[(1.0, EVENT[i:i + 1]) for i in range(len(EVENT))], timeout=10)
    assert one_byte.status == 408 and one_byte.seconds < CLIENT_TIMEOUT + 1.5, one_byte
    # what is not HTTP/1.1 gets a problem 400; a connection that says nothing is just closed
    hello = exchange(host, port, b"HELLO\r\n\r\n")
    assert hello.status == 400 and b"Connection: close" in hello.head
    silent = exchange(host, port, b"", timeout=10)
    assert silent.status is None and CLIENT_TIMEOUT - 0.1 <= silent.seconds <= CLIENT_TIMEOUT + 1.5

    assert not Event.objects.exists() and not IdempotencyKey.objects.exists()
    metrics = requests.get(f"{server.url}/metrics", timeout=5).text
    refused = {status: float(value) for status, value in
               re.findall(r'herald_http_refused_total\{status="(\d+)"\} (\S+)', metrics)}
    assert refused == {"400": 1.0, "408": 1.0, "413": 3.0, "431": 2.0}


def test_whole_requests_still_work_chunked_expect_continue_pipelined_and_kept_alive(processes, api):
    server = _start(processes)
    host, port = "127.0.0.1", _port(server)

    def post_head(extra: bytes) -> bytes:
        return (b"POST /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\nIdempotency-Key: whole-%s\r\n"
                b"Content-Type: application/json\r\n" % (api.token.encode(), uuid.uuid4().hex.encode())) + extra

    chunked = exchange(host, port, post_head(b"Transfer-Encoding: chunked\r\n\r\n") +
                       b"%x\r\n%s\r\n0\r\n\r\n" % (len(EVENT), EVENT))
    assert chunked.status == 202, chunked.head

    # Expect: 100-continue: the interim answer comes before the body is sent, once, then the real one
    import socket
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(post_head(b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(EVENT)))
        assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(EVENT)
        answer = b""
        while b"}" not in answer:
            answer += sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 202 "), answer
    assert b"100 Continue" not in answer

    # two requests in one write, then a third on the same kept-alive connection
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        received = b""
        while received.count(b"HTTP/1.1 200 OK") < 2:
            received += sock.recv(65536)
        time.sleep(0.2)   # the input: the third request comes later, in a write of its own
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        while True:
            data = sock.recv(65536)
            if not data:
                break
            received += data
    assert received.count(b"HTTP/1.1 200 OK") == 3
    assert Event.objects.count() == 2


def test_clients_that_ask_to_close_and_never_do_do_not_stall_the_worker(processes, api):
    """An answer with `Connection: close` ends with a lingering close (the server's side shut, the client's bytes
    read until it closes, at most 2 s). gunicorn lingers on the event loop's own thread, so eight such clients
    that never close held every other connection of the worker for 16 s; the worker lingers beside its other
    connections instead."""
    server = warm(processes(gunicorn(free_port(), workers=1, threads=4)))
    port = _port(server)
    clients, started = [], time.monotonic()
    try:
        for _ in range(8):
            client = socket.create_connection(("127.0.0.1", port), timeout=10)
            client.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            clients.append(client)
        for client in clients:   # each answered, and the server's side shut (it has nothing more to send)
            answer = b""
            while chunk := client.recv(65536):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        assert requests.get(f"{server.url}/healthz", timeout=30).status_code == 200
        took = time.monotonic() - started
        # each client's lingering close held the worker for 2 s: about 16 s in all (5 s allows for a loaded box)
        assert took < 5, f"eight answers and a /healthz took {took:.1f} s beside clients that never closed"
    finally:
        for client in clients:
            client.close()
