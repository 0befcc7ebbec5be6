"""Fair turns in gunicorn's buffered worker (config/gunicorn_worker.py): whole requests wait for a thread in one
queue per credential (and tenant acted for), served in turn. The queue is decided by who the credential is,
not by how its `Authorization` header is spelled: a client cannot get more turns by spelling its token many
ways, nor by sending headers that name no credential at all.

Each test holds the worker's only thread on a database lock (a poll whose endpoint row the test has locked),
queues a flood of one client's requests and then one request of another credential behind it, lets the
thread go, and looks at how much of the flood was answered when the other request was: served in turn, it
is among the first; given a turn per spelling, it comes after the whole flood."""
import socket
import uuid

import pytest
import requests
from django.db import connection, transaction

from intake.credentials import credential_create_platform
from tests.conftest import make_api, wait_until
from tests.processes import free_port, gunicorn, warm
from webhooks.models import Endpoint

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FLOOD = 200   # under the listen backlog (tests/processes.py: 256), so every connection is accepted at once


@pytest.fixture
def server():
    # one worker, one thread: while the blocked poll holds the thread, everything else waits for a turn
    process = warm(gunicorn(free_port(), workers=1, threads=1, WEB_STATEMENT_TIMEOUT_SECONDS="60"))
    try:
        yield process
    finally:
        process.stop()


def _send(url: str, authorization: str, path: str = "/api/v1/endpoints") -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    # kept alive: gunicorn's gthread closes a `Connection: close` one by lingering on the event loop until the
    # client closes too (up to 2 s each), and these stay open until the test has counted the answers
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: {authorization}\r\n\r\n".encode())
    return sock


def _status(sock: socket.socket) -> int:
    sock.settimeout(60)
    head = sock.recv(64)
    return int(head.split(b" ")[1])


def _answered(sockets) -> int:
    """How many of these connections have an answer waiting (without taking it)."""
    count = 0
    for sock in sockets:
        sock.setblocking(False)
        try:
            count += bool(sock.recv(1, socket.MSG_PEEK))
        except BlockingIOError:
            pass
    return count


def _other_after_flood(server, flood: list[tuple[str, str]], other: tuple[str, str]) -> tuple[int, int]:
    """Hold the thread, queue the flood and then the other request (each an (Authorization, path)), let go:
    (the other's status, how many of the flood were answered by the time the other was)."""
    holder = make_api("turns-holder")
    endpoint = requests.post(f"{server.url}/api/v1/endpoints", json={"kind": "poll"}, timeout=30, headers={
        "Authorization": f"Bearer {holder.token}", "Idempotency-Key": f"key-{uuid.uuid4()}"}).json()
    with transaction.atomic():
        Endpoint.objects.select_for_update().filter(pk=endpoint["id"]).first()
        blocked = _send(server.url, f"Bearer {holder.token}", f"/api/v1/endpoints/{endpoint['id']}/messages")

        def waiting_on_the_lock() -> bool:
            # pg_stat_activity read afresh, not as this transaction first saw it
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_stat_clear_snapshot()")
                cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                               "AND wait_event_type = 'Lock' AND query LIKE '%FOR NO KEY UPDATE%'")
                return cursor.fetchone()[0] == 1

        wait_until(waiting_on_the_lock, timeout=30, message="the poll holding the thread, blocked on the lock")
        flooding = [_send(server.url, authorization, path) for authorization, path in flood]
        last = _send(server.url, *other)
    # the lock is gone: the thread serves the blocked poll, then the queued requests in turn
    assert _status(blocked) == 200
    status = _status(last)
    answered = _answered(flooding)
    for sock in [blocked, last, *flooding]:
        sock.close()
    return status, answered


LIST = "/api/v1/endpoints"


def test_spelling_a_token_many_ways_gets_no_more_turns(server, api, other_api):
    for each in (api, other_api):   # both credentials are known to the worker, as any that has called it once
        assert requests.get(f"{server.url}{LIST}", timeout=30,
                            headers={"Authorization": f"Bearer {each.token}"}).status_code == 200
    # FLOOD spellings of one token, every one of them accepted: the scheme in any case, any number of spaces
    spellings = ["".join(c.upper() if n >> i & 1 else c for i, c in enumerate("bearer")) + " " * (1 + n // 64)
                 + api.token for n in range(FLOOD)]
    assert len(set(spellings)) == FLOOD
    assert requests.get(f"{server.url}{LIST}", headers={"Authorization": spellings[-1]}, timeout=30).status_code == 200
    status, answered = _other_after_flood(server, [(spelling, LIST) for spelling in spellings],
                                          (f"Bearer {other_api.token}", LIST))
    assert status == 200
    assert answered < FLOOD // 2, f"the other credential's call was answered after {answered} of the flood"


def test_headers_that_name_no_credential_share_one_turn(server, other_api):
    assert requests.get(f"{server.url}{LIST}", timeout=30,
                        headers={"Authorization": f"Bearer {other_api.token}"}).status_code == 200
    garbage = [f"Bearer hrld_not-a-token-{n}-{uuid.uuid4().hex}" for n in range(FLOOD // 2)]
    garbage += [f"Basic {uuid.uuid4().hex}" for _ in range(FLOOD // 2)]
    status, answered = _other_after_flood(server, [(header, LIST) for header in garbage],
                                          (f"Bearer {other_api.token}", LIST))
    assert status == 200
    assert answered < FLOOD // 2, f"the other credential's call was answered after {answered} of the flood"


def test_a_platform_credential_takes_its_turns_per_tenant(server):
    """One tenant's flood through a platform credential does not hold back the same credential's call for
    another tenant."""
    _, token = credential_create_platform(name="turns platform")
    bearer = f"Bearer {token}"
    tenants = [requests.post(f"{server.url}/api/v1/tenants", json={"name": f"turns {n}"}, timeout=30,
                             headers={"Authorization": bearer, "Idempotency-Key": f"key-{uuid.uuid4()}"}).json()
               for n in range(2)]
    flooded, other = (f"/api/v1/tenants/{tenant['id']}/endpoints" for tenant in tenants)
    for path in (flooded, other):   # the worker has seen the credential act for both, as after any call for each
        assert requests.get(f"{server.url}{path}", headers={"Authorization": bearer}, timeout=30).status_code == 200
    status, answered = _other_after_flood(server, [(bearer, flooded)] * FLOOD, (bearer, other))
    assert status == 200
    assert answered < FLOOD // 2, f"the other tenant's call was answered after {answered} of the flood"
