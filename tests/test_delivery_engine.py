"""The delivery engine in-process: per-endpoint cap, parking and hand-on, the breaker, operational events.

Real PostgreSQL, real Redis (the `broker` fixture reads what was published) and a real receiver; the
worker is this process, so every step can be looked at. `test_delivery_isolation.py` runs the same
rules through real Celery workers.
"""
import threading
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from tests.conftest import create_endpoint, wait_until
from tests.receiver import Answer
from webhooks.delivery.destinations import http_transport as transport
from webhooks.models import Delivery, DeliveryAttempt, DeliveryLease, DeliveryOutbox, Endpoint, Event
from webhooks.delivery.dispatcher import deliveries_dispatch_due
from webhooks.delivery.claim import delivery_claim
from webhooks.delivery.engine import delivery_attempt
from webhooks.delivery.record import delivery_record
from webhooks.services.endpoints import endpoint_delete, endpoint_update

pytestmark = pytest.mark.django_db(transaction=True)


def _deliveries(api, count, event_type="invoice.paid", endpoint=None):
    """Post `count` events; the id of each one's delivery (to `endpoint`, if several match)."""
    out = []
    for n in range(count):
        deliveries = api.send_event(event_type, {"n": n})["deliveries"]
        out += [d["id"] for d in deliveries if endpoint is None or d["endpoint_id"] == endpoint["id"]][:1]
    return out


def _send(claim):
    """The attempt of a claim made by the test, sent for real and recorded."""
    started_at = timezone.now()
    result = transport.send(url=claim.url, body=claim.payload, headers={"content-type": "application/json"},
                            timeout=2, allow_private_networks=True)
    return delivery_record(claim=claim, started_at=started_at, result=result)


def _parked(ids):
    return set(Delivery.objects.filter(pk__in=ids, parked_at__isnull=False).values_list("id", flat=True))


def _pause_over(endpoint_id):
    """Wait until the tripped endpoint's pause is over by PostgreSQL's clock (the one the claim reads)."""
    wait_until(lambda: Endpoint.objects.filter(pk=endpoint_id, next_probe_at__lte=Now()).exists(), timeout=30,
               message="the breaker's pause to end")


def _operational(tenant):
    return list(Event.objects.filter(tenant=tenant, type__startswith="herald.").order_by("id"))


def test_a_delivery_over_the_cap_is_parked_without_an_attempt_and_handed_on_when_a_slot_frees(api, receiver, broker):
    # given an endpoint that takes one attempt at a time, with one in flight
    create_endpoint(api, receiver.url(), max_in_flight=1)
    first, second = _deliveries(api, 2)
    claim = delivery_claim(delivery_id=first)
    assert claim is not None

    # when the second delivery's task runs
    assert delivery_attempt(delivery_id=second) is None

    # then it is parked: no request, no attempt, no retry step, out of every queue
    waiting = Delivery.objects.get(pk=second)
    assert waiting.parked_at is not None and waiting.attempt_count == 0
    assert not DeliveryOutbox.objects.filter(delivery=waiting).exists()
    assert not DeliveryAttempt.objects.filter(delivery_id=second).exists()
    assert receiver.received == []
    assert deliveries_dispatch_due() == []  # beat leaves a parked delivery alone

    # and the attempt that frees the slot hands it on into the queue, without waiting for beat
    broker.clear()
    assert _send(claim) == Delivery.SUCCEEDED
    assert _parked([second]) == set()
    assert second in broker.delivery_ids()
    assert delivery_attempt(delivery_id=second) == Delivery.SUCCEEDED
    assert [a.number for a in DeliveryAttempt.objects.filter(delivery_id=second)] == [1]


def test_concurrent_claims_never_exceed_the_cap(api, receiver):
    """On either broker (no `broker` fixture: the RabbitMQ run keeps it). Intake publishes nothing itself and
    no relay runs here, so no task of these deliveries is queued: this test runs them itself."""
    # given eight deliveries for an endpoint capped at three, and a receiver that takes 0.3 s
    create_endpoint(api, receiver.url(), max_in_flight=3)
    ids = _deliveries(api, 8)
    receiver.script("/hook", *[Answer(delay=0.3)] * 8)
    start = threading.Barrier(8)
    outcomes = {}

    def worker(delivery_id):
        start.wait()
        try:
            outcomes[delivery_id] = delivery_attempt(delivery_id=delivery_id)
        finally:
            connection.close()

    # when eight threads run their tasks at the same moment
    threads = [threading.Thread(target=worker, args=(i,)) for i in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)

    # then three were sent and five parked; each finished attempt handed one parked delivery on
    assert sorted(outcomes.values(), key=str) == sorted([Delivery.SUCCEEDED] * 3 + [None] * 5, key=str)
    assert receiver.path_max_in_flight["/hook"] == 3
    assert len(receiver.received) == 3
    assert len(_parked(ids)) == 2
    # handed on: out of the parked set, into the outbox (published to the retry queue), no attempt yet
    handed = set(Delivery.objects.filter(pk__in=ids, status=Delivery.PENDING, parked_at__isnull=True,
                                         attempt_count=0).values_list("id", flat=True))
    assert len(handed) == 3 and not handed & _parked(ids)
    assert set(DeliveryOutbox.objects.filter(delivery_id__in=ids).values_list("delivery_id", flat=True)) == handed


def test_a_claim_whose_worker_died_costs_no_retry_step(api, receiver):
    create_endpoint(api, receiver.url())
    (delivery_id,) = _deliveries(api, 1)
    assert delivery_claim(delivery_id=delivery_id).number == 1
    DeliveryLease.objects.filter(delivery_id=delivery_id).update(until=timezone.now() - timedelta(seconds=1))  # ran out
    assert delivery_attempt(delivery_id=delivery_id) == Delivery.SUCCEEDED
    delivery = Delivery.objects.get(pk=delivery_id)
    assert delivery.attempt_count == 1
    assert [a.number for a in delivery.attempts.all()] == [1]


def test_a_late_record_does_not_undo_a_cancel_but_is_kept_and_frees_the_slot(api, receiver):
    endpoint = create_endpoint(api, receiver.url(), max_in_flight=1)
    (delivery_id,) = _deliveries(api, 1)
    claim = delivery_claim(delivery_id=delivery_id)
    endpoint_delete(endpoint=Endpoint.objects.get(pk=endpoint["id"]))  # while the attempt is in flight
    assert Delivery.objects.get(pk=delivery_id).status == Delivery.CANCELLED
    _send(claim)
    delivery = Delivery.objects.get(pk=delivery_id)
    assert delivery.status == Delivery.CANCELLED and not DeliveryLease.objects.filter(delivery=delivery).exists()
    assert [(a.number, a.response_status) for a in delivery.attempts.all()] == [(1, 200)]


def test_endpoint_update_writes_only_what_it_was_given(api, receiver):
    endpoint = create_endpoint(api, receiver.url())
    stale = Endpoint.objects.get(pk=endpoint["id"])  # read before a worker trips the breaker
    tripped_at = timezone.now()
    Endpoint.objects.filter(pk=stale.pk).update(consecutive_failures=5, tripped_at=tripped_at,
                                                next_probe_at=tripped_at, failing_since=tripped_at)
    endpoint_update(endpoint=stale, description="billing")
    fresh = Endpoint.objects.get(pk=stale.pk)
    assert fresh.description == "billing"
    assert (fresh.consecutive_failures, fresh.tripped_at, fresh.failing_since) == (5, tripped_at, tripped_at)


def test_raising_the_cap_hands_parked_deliveries_on_at_once(api, receiver, broker):
    endpoint = create_endpoint(api, receiver.url(), max_in_flight=1)
    ids = _deliveries(api, 4)
    assert delivery_claim(delivery_id=ids[0]) is not None
    for delivery_id in ids[1:]:
        assert delivery_attempt(delivery_id=delivery_id) is None
    assert _parked(ids) == set(ids[1:])
    broker.clear()
    response = api.patch(f"endpoints/{endpoint['id']}", {"max_in_flight": 3})
    assert response.status_code == 200 and response.json()["max_in_flight"] == 3
    assert _parked(ids) == {ids[3]}  # one slot is still taken by the attempt in flight
    assert sorted(broker.delivery_ids()) == ids[1:3]
    # handed on means published: if that message is lost, beat's dispatcher sends it again
    handed = DeliveryOutbox.objects.filter(delivery_id__in=ids[1:3], published_at__isnull=False, periodic=True)
    assert handed.count() == 2
    broker.clear()
    handed.update(published_at=timezone.now() - timedelta(seconds=settings.WEBHOOK_REDISPATCH_AFTER_SECONDS + 1))
    assert sorted(deliveries_dispatch_due()) == ids[1:3]


def test_disabling_fails_what_waits_and_enabling_starts_afresh(api, receiver):
    endpoint = create_endpoint(api, receiver.url(), max_in_flight=1)
    ids = _deliveries(api, 3)
    claim = delivery_claim(delivery_id=ids[0])
    assert delivery_attempt(delivery_id=ids[1]) is None
    Endpoint.objects.filter(pk=endpoint["id"]).update(consecutive_failures=3, failing_since=timezone.now())
    assert api.patch(f"endpoints/{endpoint['id']}", {"enabled": False}).status_code == 200
    statuses = dict(Delivery.objects.filter(pk__in=ids).values_list("id", "status"))
    assert statuses == {ids[0]: "pending", ids[1]: "failed", ids[2]: "failed"}  # the one in flight finishes
    assert not DeliveryOutbox.objects.filter(delivery_id__in=ids).exists()  # nothing left to publish
    _send(claim)
    body = api.patch(f"endpoints/{endpoint['id']}", {"enabled": True}).json()
    assert body["health"] == {"state": "healthy", "consecutive_failures": 0, "failing_since": None,
                              "next_probe_at": None}


def _attempted(endpoint_id) -> int:
    return DeliveryAttempt.objects.filter(delivery__endpoint_id=endpoint_id).count()


def test_the_breaker_trips_parks_probes_and_recovers(api, sink, broker, settings):
    """For every destination kind (the `sink` fixture): down, it trips; its probe fails; up, it recovers."""
    settings.WEBHOOK_BREAKER_FAILURES = 2
    settings.WEBHOOK_BREAKER_COOLDOWN_SECONDS = 1
    monitor = create_endpoint(api, **sink.endpoint_fields("/monitor"), event_types=["herald.*"])
    flaky = create_endpoint(api, **sink.endpoint_fields("/flaky"), event_types=["invoice.*"], max_in_flight=5)
    sink.down("/flaky")  # two failures trip it; the first probe fails too
    ids = _deliveries(api, 4)

    # two consecutive failures trip the breaker and tell the tenant
    assert delivery_attempt(delivery_id=ids[0]) == Delivery.PENDING
    assert delivery_attempt(delivery_id=ids[1]) == Delivery.PENDING
    health = api.get(f"endpoints/{flaky['id']}").json()["health"]
    assert health["state"] == "tripped" and health["consecutive_failures"] == 2
    assert health["failing_since"] is not None and health["next_probe_at"] is not None
    (tripped,) = _operational(api.tenant)
    assert tripped.type == "herald.endpoint.tripped"
    assert tripped.data["endpoint_id"] == flaky["id"] and tripped.data["consecutive_failures"] == 2
    assert [d.endpoint_id for d in tripped.deliveries.all()] == [monitor["id"]]

    # while tripped nothing is sent, and waiting uses up no retry step
    assert delivery_attempt(delivery_id=ids[2]) is None
    assert delivery_attempt(delivery_id=ids[3]) is None
    assert _parked(ids) == {ids[2], ids[3]}
    assert Delivery.objects.get(pk=ids[2]).attempt_count == 0
    assert _attempted(flaky["id"]) == 2

    # the pause ends: beat lets one probe go (the oldest parked delivery); it fails, the pause doubles
    _pause_over(flaky["id"])
    broker.clear()
    assert ids[2] in deliveries_dispatch_due()
    before = timezone.now()
    assert delivery_attempt(delivery_id=ids[2]) == Delivery.PENDING
    after = timezone.now()
    endpoint = Endpoint.objects.get(pk=flaky["id"])
    assert endpoint.failed_probes == 1
    # twice the 1 s pause, counted from the failed probe (recorded between `before` and `after`)
    assert before + timedelta(seconds=2) <= endpoint.next_probe_at <= after + timedelta(seconds=2)
    assert delivery_attempt(delivery_id=ids[3]) is None  # still one probe at a time

    # the next probe succeeds: the breaker closes, the tenant hears of it, the backlog flows
    sink.up("/flaky")
    _pause_over(flaky["id"])
    broker.clear()
    woken = deliveries_dispatch_due()
    probe = next(i for i in ids if i in woken)
    assert delivery_attempt(delivery_id=probe) == Delivery.SUCCEEDED
    assert api.get(f"endpoints/{flaky['id']}").json()["health"]["state"] == "healthy"
    assert [e.type for e in _operational(api.tenant)] == ["herald.endpoint.tripped", "herald.endpoint.recovered"]
    assert _parked(ids) == set()
    Delivery.objects.filter(pk__in=ids, status="pending").update(next_attempt_at=timezone.now())
    for delivery_id in ids:
        delivery_attempt(delivery_id=delivery_id)
    assert Delivery.objects.filter(pk__in=ids, status=Delivery.SUCCEEDED).count() == 4
    # the parked delivery that became the probe paid one attempt for its own failure, none for waiting
    assert Delivery.objects.get(pk=ids[3]).attempt_count == 1
    assert len(sink.wait_for(4, "/flaky")) == 4
    # the tenant's operational events reach its monitoring endpoint, of whatever kind
    for event in _operational(api.tenant):
        assert delivery_attempt(delivery_id=event.deliveries.get().id) == Delivery.SUCCEEDED
    tripped, recovered = sink.wait_for(2, "/monitor")
    assert {a.headers["webhook-id"] for a in (tripped, recovered)} == {e.id for e in _operational(api.tenant)}
    assert monitor["id"]


def test_operational_events_go_only_to_endpoints_that_name_them(api, receiver, settings):
    settings.WEBHOOK_RETRY_SCHEDULE = "0"
    subscribers = {name: create_endpoint(api, receiver.url(f"/{name}"), event_types=types, channels=channels)["id"]
                   for name, types, channels in [
                       ("all", [], []), ("star", ["*"], []), ("herald", ["herald.*"], []),
                       ("exact", ["herald.endpoint.disabled"], []), ("failed", ["herald.delivery.failed"], []),
                       ("channelled", ["herald.endpoint.*"], ["eu"])]}
    gone = create_endpoint(api, receiver.url("/gone"), event_types=["gone.*"])
    receiver.script("/gone", 410)
    (delivery_id,) = _deliveries(api, 1, event_type="gone.away", endpoint=gone)

    assert delivery_attempt(delivery_id=delivery_id) == Delivery.FAILED
    assert Endpoint.objects.get(pk=gone["id"]).enabled is False
    events = _operational(api.tenant)
    assert [e.type for e in events] == ["herald.endpoint.disabled", "herald.delivery.failed"]
    disabled, failed = events
    assert disabled.data == {"endpoint_id": gone["id"], "url": gone["url"], "reason": "receiver answered 410 Gone"}
    assert {d.endpoint_id for d in disabled.deliveries.all()} == {
        subscribers["herald"], subscribers["exact"], subscribers["channelled"]}
    assert {d.endpoint_id for d in failed.deliveries.all()} == {subscribers["herald"], subscribers["failed"]}
    assert failed.data["delivery_id"] == delivery_id and failed.data["last_attempt"]["response_status"] == 410

    # a delivery of an operational event that fails for good causes no operational event of its own
    receiver.script("/herald", 500, 500)
    op_delivery = disabled.deliveries.get(endpoint_id=subscribers["herald"]).id
    assert delivery_attempt(delivery_id=op_delivery) == Delivery.PENDING
    assert delivery_attempt(delivery_id=op_delivery) == Delivery.FAILED
    assert len(_operational(api.tenant)) == 2


def test_a_delivery_that_uses_its_last_attempt_is_reported(api, sink, settings):
    """For every destination kind (the `sink` fixture), down for both attempts; the report reaches the kind too."""
    settings.WEBHOOK_RETRY_SCHEDULE = "0"
    monitor = create_endpoint(api, **sink.endpoint_fields("/monitor"), event_types=["herald.delivery.failed"])
    target = create_endpoint(api, **sink.endpoint_fields("/down"), event_types=["invoice.*"])
    sink.down("/down")
    (delivery_id,) = _deliveries(api, 1)
    assert delivery_attempt(delivery_id=delivery_id) == Delivery.PENDING
    assert _operational(api.tenant) == []
    assert delivery_attempt(delivery_id=delivery_id) == Delivery.FAILED
    (event,) = _operational(api.tenant)
    last = event.data.pop("last_attempt")
    assert event.data == {"delivery_id": delivery_id, "event_id": Delivery.objects.get(pk=delivery_id).event_id,
                          "event_type": "invoice.paid", "endpoint_id": target["id"], "url": target["url"],
                          "attempts": 2}
    if sink.kind == "http":
        assert last == {"response_status": 500, "error": ""}
    else:  # a broker that refuses connections; the URL in the event is the one shown, without credentials
        assert last["response_status"] is None and last["error"].startswith("connection_error")
    (op_delivery,) = event.deliveries.all()
    assert op_delivery.endpoint_id == monitor["id"]
    assert delivery_attempt(delivery_id=op_delivery.id) == Delivery.SUCCEEDED
    (report,) = sink.wait_for(1, "/monitor")
    assert report.headers["webhook-id"] == event.id


def test_a_batch_of_failures_is_recorded_in_a_few_statements_as_one_by_one_would(api, receiver, settings):
    """The record's slow path takes a whole batch in one transaction (SPEC §10: a tenant whose endpoints fail in
    bulk must not hold up the engine's turns): each attempt's breaker change follows from the ones before it on its
    endpoint, the trip happens once at the threshold with one operational event, a 410 disables its endpoint once,
    and the statements do not grow with the batch."""
    from django.test.utils import CaptureQueriesContext

    from webhooks.delivery.attempts import Outcome
    from webhooks.delivery.claim import deliveries_claim
    from webhooks.delivery.record import deliveries_record

    settings.WEBHOOK_BREAKER_FAILURES = 3
    monitor = create_endpoint(api, receiver.url("/monitor"), event_types=["herald.*"])
    flaky = create_endpoint(api, receiver.url("/flaky"), event_types=["invoice.*"], max_in_flight=20)
    gone = create_endpoint(api, receiver.url("/gone"), event_types=["invoice.*"], max_in_flight=20)
    receiver.script("/flaky", *[500] * 5)
    receiver.script("/gone", 500, 410, 500)
    events = [api.send_event("invoice.paid", {"n": n})["deliveries"] for n in range(5)]
    to_flaky = [d["id"] for deliveries in events for d in deliveries if d["endpoint_id"] == flaky["id"]]
    to_gone = [d["id"] for deliveries in events for d in deliveries if d["endpoint_id"] == gone["id"]][:3]

    claims = deliveries_claim(delivery_ids=to_flaky + to_gone).claims
    assert set(claims) == set(to_flaky + to_gone)
    outcomes = []
    for delivery_id in to_flaky + to_gone:  # sent for real, one after the other, then recorded together
        claim = claims[delivery_id]
        started_at = timezone.now()
        outcomes.append(Outcome(claim, started_at, transport.send(
            url=claim.url, body=claim.payload, headers={"content-type": "application/json"}, timeout=2,
            allow_private_networks=True)))
    with CaptureQueriesContext(connection) as queries:
        statuses = deliveries_record(outcomes=outcomes)

    assert statuses[:5] == [Delivery.PENDING] * 5
    assert statuses[5:] == [Delivery.PENDING, Delivery.FAILED, Delivery.PENDING]
    flaky_row = Endpoint.objects.get(pk=flaky["id"])
    # five consecutive failures, tripped at the third (the two after it started before the trip)
    assert flaky_row.consecutive_failures == 5 and flaky_row.tripped_at is not None
    assert flaky_row.failed_probes == 0 and flaky_row.failing_since is not None
    gone_row = Endpoint.objects.get(pk=gone["id"])
    assert gone_row.enabled is False and gone_row.disabled_reason == "receiver answered 410 Gone"
    assert gone_row.consecutive_failures == 3 and gone_row.tripped_at is not None
    assert DeliveryAttempt.objects.filter(delivery_id__in=to_flaky + to_gone).count() == 8
    assert not DeliveryLease.objects.filter(delivery_id__in=to_flaky + to_gone).exists()
    assert sorted(e.type for e in _operational(api.tenant)) == [
        "herald.delivery.failed", "herald.endpoint.disabled", "herald.endpoint.tripped", "herald.endpoint.tripped"]
    tripped = next(e for e in _operational(api.tenant)
                   if e.type == "herald.endpoint.tripped" and e.data["endpoint_id"] == flaky["id"])
    assert tripped.data["consecutive_failures"] == 3
    assert [d.endpoint_id for d in tripped.deliveries.all()] == [monitor["id"]]
    # the writes of eight attempts on two endpoints, in statements that do not grow with the batch: the lock, the
    # breakers, the record, then the 410's disable and the operational events (each an event of its own)
    assert len(queries) <= 25, [q["sql"][:80] for q in queries]
