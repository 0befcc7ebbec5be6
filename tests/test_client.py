"""The Python client (clients/python) against the live API: real gunicorn, a Celery worker, PostgreSQL.

Every call of the tenant API, typed errors as Herald really answers them, pagination over several
pages, `verify()` on what a worker really sent, and the retry loop proven end to end: a proxy in front
of Herald that answers 503 (or loses Herald's answer) before letting a retry through, a request held
mid-flight by a real table lock (409 in progress), and a rate-limited gunicorn (429 with Retry-After).
The platform calls (tenants) are in tests/test_client_platform.py.
"""
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
import requests

import herald_client
from herald_client import Herald, RetryInfo, RetryPolicy, verify
from tests.conftest import other_session, wait_until
from tests.processes import celery_worker, free_port, gunicorn
from tests.stub_http import Step, StubServer, problem
from webhooks.models import Event
from webhooks.delivery.signing import generate_secret

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    """The API (one gunicorn worker with four threads: a request held by a lock leaves three) and a
    Celery worker, on the test database and a private queue."""
    processes = []
    try:
        processes.append(gunicorn(free_port(), workers=1, threads=4))
        processes.append(celery_worker("client"))
        yield processes[0]
    finally:
        for process in processes:
            process.stop()


@pytest.fixture
def retries() -> list[RetryInfo]:
    return []


@pytest.fixture
def herald(server, api, retries):
    with Herald(server.url, api.token, retry=RetryPolicy(base_delay=0.05), on_retry=retries.append) as client:
        yield client


@pytest.fixture
def proxy(server):
    """A scripted proxy in front of the live API (then it forwards everything)."""
    made = []

    def make(*steps: Step) -> StubServer:
        made.append(StubServer(*steps, upstream=server.url))
        return made[-1]

    yield make
    for stub in made:
        stub.close()


def _events(api) -> int:
    return Event.objects.filter(tenant=api.tenant).count()


# ------------------------------------------------------------------ every call of the tenant API

def test_every_endpoint_call(herald, receiver, retries):
    created = herald.endpoints.create(receiver.url("/hook"), event_types=["invoice.*"], channels=["eu"],
                                      description="billing", max_in_flight=5, throttle_rate=10, ordering="fifo")
    endpoint_id = created["id"]
    assert endpoint_id.startswith("ep_") and "secret" not in created
    assert (created["url"], created["event_types"], created["channels"], created["description"]) == (
        receiver.url("/hook"), ["invoice.*"], ["eu"], "billing")
    assert (created["max_in_flight"], created["throttle_rate"], created["ordering"]) == (5, 10, "fifo")
    assert created["health"]["state"] == "healthy" and created["enabled"] is True
    assert herald.endpoints.get(endpoint_id) == created
    assert endpoint_id in [endpoint["id"] for endpoint in herald.endpoints.list()]

    secret = herald.endpoints.secret(endpoint_id)
    assert secret.startswith("whsec_")
    updated = herald.endpoints.update(endpoint_id, description="billing, EU", enabled=False, throttle_rate=None,
                                      max_in_flight=None)
    assert (updated["description"], updated["enabled"], updated["throttle_rate"]) == ("billing, EU", False, None)
    assert updated["ordering"] == "fifo" and updated["event_types"] == ["invoice.*"], "what was not sent stays"
    rotated = herald.endpoints.rotate_secret(endpoint_id)
    assert rotated["id"] == endpoint_id and herald.endpoints.secret(endpoint_id) not in (secret, "")
    guarded = herald.endpoints.update(endpoint_id, headers={"X-Api-Key": "k-secret-value"},
                                      auth={"type": "basic", "username": "u", "password": "p-secret-value"})
    assert guarded["header_names"] == ["X-Api-Key"] and guarded["auth"] == {"type": "basic", "username": "u"}
    assert guarded["client_certificate"] is None and guarded["description"] == "billing, EU"
    cleared = herald.endpoints.update(endpoint_id, headers=None, auth=None)
    assert (cleared["header_names"], cleared["auth"]) == ([], None)

    herald.endpoints.update(endpoint_id, enabled=True)
    test_event = herald.endpoints.test(endpoint_id)
    assert test_event["type"] == "herald.test"
    assert [d["endpoint_id"] for d in test_event["deliveries"]] == [endpoint_id]
    (received,) = receiver.wait_for(1, "/hook")
    assert received.headers["webhook-id"] == test_event["id"]

    herald.endpoints.delete(endpoint_id)
    with pytest.raises(herald_client.NotFound):
        herald.endpoints.get(endpoint_id)
    with pytest.raises(herald_client.NotFound):
        herald.endpoints.delete(endpoint_id)
    assert retries == []


def test_events_deliveries_and_verify_on_a_real_delivery(herald, receiver):
    endpoint = herald.endpoints.create(receiver.url("/hook"))
    secret = herald.endpoints.secret(endpoint["id"])

    event = herald.events.create("invoice.paid", {"invoice": "in_1", "amount": 42}, channels=["eu"])
    assert event["id"].startswith("evt_") and event["channels"] == ["eu"]
    ((delivery_ref),) = event["deliveries"]
    assert herald.events.get(event["id"])["id"] == event["id"]
    assert [e["id"] for e in herald.events.list(type="invoice.paid")] == [event["id"]]
    assert list(herald.events.list(type="customer.created")) == []

    # what the worker really sent verifies with the endpoint's secret, and with no other
    (request,) = receiver.wait_for(1, "/hook")
    payload = verify(request.body, request.headers, secret)
    assert payload["type"] == "invoice.paid" and payload["data"] == {"invoice": "in_1", "amount": 42}
    assert request.headers["webhook-id"] == event["id"]
    with pytest.raises(herald_client.WebhookVerificationError):
        verify(request.body, request.headers, generate_secret())
    with pytest.raises(herald_client.WebhookVerificationError):
        verify(request.body.replace(b"42", b"43"), request.headers, secret)

    delivery = wait_until(lambda: (d := herald.deliveries.get(delivery_ref["id"]))["status"] == "succeeded" and d,
                          message="the delivery to succeed")
    assert (delivery["event_id"], delivery["endpoint_id"], delivery["attempt_count"]) == (
        event["id"], endpoint["id"], 1)
    assert [attempt["response_status"] for attempt in delivery["attempts"]] == [200]
    assert [d["id"] for d in herald.deliveries.list(event=event["id"])] == [delivery_ref["id"]]
    assert [d["id"] for d in herald.deliveries.list(endpoint=endpoint["id"], status="succeeded")] == [
        delivery_ref["id"]]
    assert list(herald.deliveries.list(endpoint=endpoint["id"], status="failed")) == []

    # a manual retry sends it again; after a rotation both the old and the new secret verify it
    herald.endpoints.rotate_secret(endpoint["id"])
    new_secret = herald.endpoints.secret(endpoint["id"])
    retried = herald.deliveries.retry(delivery_ref["id"])
    assert retried["id"] == delivery_ref["id"] and retried["status"] == "pending"
    _, again = receiver.wait_for(2, "/hook")
    assert again.headers["webhook-id"] == event["id"] and len(again.headers["webhook-signature"].split()) == 2
    assert verify(again.body, again.headers, secret) == verify(again.body, again.headers, new_secret) == payload


def test_recover_an_endpoint_and_follow_it(herald, receiver):
    """`endpoints.recover` resends what failed; `recoveries.get` follows it to `completed`."""
    from webhooks.models import Delivery, DeliveryOutbox

    endpoint_id = herald.endpoints.create(receiver.url("/recovered"))["id"]
    since = datetime.now(timezone.utc)
    events = [herald.events.create("invoice.paid", {"n": n})["id"] for n in range(3)]
    receiver.wait_for(3, "/recovered")
    wait_until(lambda: Delivery.objects.filter(endpoint_id=endpoint_id, status=Delivery.SUCCEEDED).count() == 3)
    Delivery.objects.filter(endpoint_id=endpoint_id).update(status=Delivery.FAILED, updated_at=since)  # as if
    DeliveryOutbox.objects.filter(delivery__endpoint_id=endpoint_id).delete()
    recovery = herald.endpoints.recover(endpoint_id, since - timedelta(seconds=1))
    assert recovery["id"].startswith("rcv_") and recovery["total"] == 3 and recovery["until"] is None
    final = wait_until(lambda: (r := herald.recoveries.get(recovery["id"]))["status"] == "completed" and r)
    assert final["done"] == 3
    assert [r.headers["webhook-id"] for r in receiver.requests_to("/recovered")][3:] == events
    with pytest.raises(herald_client.ValidationError):
        herald.endpoints.recover(endpoint_id, "soon")


def test_a_portal_link_opens_the_portal(herald):
    link = herald.portal_links.create()
    assert link["url"].startswith("http") and link["expires_at"]
    assert "csrfmiddlewaretoken" in requests.get(link["url"], timeout=10).text


def test_lists_are_iterated_over_every_page_newest_first(herald):
    ids = [herald.events.create("order.created", {"n": n})["id"] for n in range(5)]
    newest_first = ids[::-1]

    assert [event["id"] for event in herald.events.list(type="order.created", limit=2)] == newest_first
    pages = list(herald.events.list(type="order.created", limit=2).pages())
    assert [[event["id"] for event in page.data] for page in pages] == [newest_first[:2], newest_first[2:4],
                                                                         newest_first[4:]]
    assert [page.next_cursor is None for page in pages] == [False, False, True]

    # a later iteration goes on from where an earlier one stopped
    first = herald.events.list(type="order.created", limit=3)
    assert [event["id"] for event in first.page().data] == newest_first[:3]
    rest = herald.events.list(type="order.created", limit=3, cursor=first.cursor)
    assert [event["id"] for event in rest] == newest_first[3:]


# ------------------------------------------------------------------ errors, as Herald answers them

def test_errors_are_raised_as_their_codes(herald, server, api, retries):
    with pytest.raises(herald_client.NotAuthenticated) as raised:
        list(Herald(server.url, "hrld_not_a_token").endpoints.list())
    assert raised.value.status == 401 and raised.value.code == "not_authenticated"

    with pytest.raises(herald_client.NotFound) as raised:
        herald.events.get("evt_01NOTHERE")
    assert raised.value.status == 404 and raised.value.request_id

    with pytest.raises(herald_client.ValidationError) as raised:
        herald.events.create("herald.endpoint.tripped", {})
    assert raised.value.status == 400 and "type" in raised.value.errors and raised.value.detail
    with pytest.raises(herald_client.ValidationError) as raised:
        herald.endpoints.create("not a url", max_in_flight=0)
    assert set(raised.value.errors) == {"url", "max_in_flight"}

    with pytest.raises(herald_client.IdempotencyKeyInvalid):
        herald.events.create("invoice.paid", {}, idempotency_key="short")
    with pytest.raises(herald_client.PayloadTooLarge) as raised:
        herald.events.create("invoice.paid", {"blob": "x" * 300_000})
    assert raised.value.status == 413
    with pytest.raises(herald_client.MethodNotAllowed):
        herald.request("PUT", "events", json={})

    # a key used again: the same request is a replay (one event), another request is refused
    key = f"order-{uuid.uuid4()}"
    first = herald.events.create("invoice.paid", {"invoice": "in_7"}, idempotency_key=key)
    replay = herald.request("POST", "events", json={"type": "invoice.paid", "data": {"invoice": "in_7"}},
                            idempotency_key=key)
    assert replay.replayed and replay.status == 202 and replay.json() == first
    with pytest.raises(herald_client.IdempotencyKeyReused) as raised:
        herald.events.create("invoice.paid", {"invoice": "in_8"}, idempotency_key=key)
    assert raised.value.status == 409 and raised.value.idempotency_key == key
    assert _events(api) == 1 and retries == []


# ------------------------------------------------------------------ the retry loop, end to end

def test_a_503_then_202_records_one_event_with_one_key(api, proxy, retries):
    front = proxy(problem(503, "server_error", ("Retry-After", "0")))  # then it lets requests through
    herald = Herald(front.url, api.token, on_retry=retries.append)

    event = herald.events.create("invoice.paid", {"invoice": "in_503"})

    first, second = front.requests
    assert first.headers["idempotency-key"] == second.headers["idempotency-key"] == retries[0].idempotency_key
    assert first.body == second.body
    assert (first.upstream_status, second.upstream_status) == (None, 202)
    assert [(retry.status, retry.delay) for retry in retries] == [(503, 0.0)]
    assert list(Event.objects.filter(tenant=api.tenant).values_list("id", flat=True)) == [event["id"]]


def test_an_answer_lost_after_herald_did_the_work_is_replayed_not_done_twice(api, proxy, retries):
    # the proxy passes the request on and then loses Herald's answer: a reset, then a 502
    front = proxy(Step(forward=True, reset=True), Step(502, {"detail": "bad gateway"}, forward=True))
    herald = Herald(front.url, api.token, retry=RetryPolicy(base_delay=0.05), on_retry=retries.append)

    answer = herald.request("POST", "events", json={"type": "invoice.paid", "data": {"invoice": "in_lost"}})

    assert [recorded.upstream_status for recorded in front.requests] == [202, 202, 202]
    assert len({recorded.headers["idempotency-key"] for recorded in front.requests}) == 1
    assert [retry.status for retry in retries] == [None, 502]
    assert answer.status == 202 and answer.replayed and answer.attempts == 3
    assert list(Event.objects.filter(tenant=api.tenant).values_list("id", flat=True)) == [answer.json()["id"]]


class EventTableLock:
    """A SHARE lock on the event table from another connection: an event insert waits on it, so a
    request is held mid-flight for real, with no hook in the code under test."""

    def __init__(self):
        self.conn = other_session(autocommit=False)
        self.conn.execute("LOCK TABLE webhooks_event IN SHARE MODE")

    def waiting(self) -> int:
        """How many other transactions wait for this lock."""
        with other_session() as other:
            return other.execute("SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = "
                                 "'webhooks_event'::regclass").fetchone()[0]

    def release(self):
        if not self.conn.closed:
            self.conn.rollback()
            self.conn.close()


def test_a_409_in_progress_is_waited_out_and_answered_by_the_first_request(server, api, retries):
    body = {"type": "invoice.paid", "data": {"invoice": "in_409"}}
    key = f"held-{uuid.uuid4()}"
    lock = EventTableLock()
    first: list[requests.Response] = []
    try:
        # someone else's request with the same key and body, held in its transaction by the lock
        thread = threading.Thread(target=lambda: first.append(requests.post(
            f"{server.url}/api/v1/events", json=body, timeout=30,
            headers={"Authorization": f"Bearer {api.token}", "Idempotency-Key": key})))
        thread.start()
        wait_until(lambda: lock.waiting() > 0, timeout=10, message="the first request to wait for the lock")

        def on_retry(info: RetryInfo) -> None:
            retries.append(info)
            lock.release()  # the first request can now finish while the client waits Retry-After

        event = Herald(server.url, api.token, on_retry=on_retry).events.create(
            body["type"], body["data"], idempotency_key=key)
    finally:
        lock.release()
    thread.join(30)

    assert [(r.status, r.code, r.delay, r.idempotency_key) for r in retries] == [
        (409, "idempotency_key_in_progress", 2.0, key)]
    assert first[0].status_code == 202 and event == first[0].json()
    assert _events(api) == 1


def test_a_429_is_waited_out_for_retry_after(api, processes, retries):
    limited = processes(gunicorn(free_port(), workers=1, threads=2, INTAKE_RATE_LIMIT_PER_SECOND=1))
    herald = Herald(limited.url, api.token, on_retry=retries.append)

    started = time.monotonic()
    events = [herald.events.create("invoice.paid", {"n": n}) for n in range(3)]

    assert len({event["id"] for event in events}) == 3 and _events(api) == 3
    throttled = [retry for retry in retries if retry.status == 429]
    assert throttled and all(retry.code == "throttled" and retry.delay >= 1.0 for retry in throttled)
    assert time.monotonic() - started >= sum(retry.delay for retry in throttled)


def test_v1a_endpoints_filters_and_a_themed_portal_link_through_the_client(herald):
    endpoint = herald.endpoints.create("https://hooks.example.com/v1a", signature="v1a",
                                       filter={"data": {"amount": {"$gte": 100}}})
    assert endpoint["signature"] == "v1a" and endpoint["filter"] == {"data": {"amount": {"$gte": 100}}}
    assert herald.endpoints.secret(endpoint["id"]).startswith("whpk_")  # what a receiver verifies with
    assert [d["endpoint_id"] for d in herald.events.create("invoice.paid", {"amount": 5})["deliveries"]] == []
    assert [d["endpoint_id"] for d in herald.events.create("invoice.paid", {"amount": 500})["deliveries"]] == [
        endpoint["id"]]
    assert herald.endpoints.update(endpoint["id"], filter=None)["filter"] is None
    assert herald.portal_links.create(theme={"name": "Acme", "accent": "#0a7"})["url"]
