"""The worker's delivery engine: many attempts on one libcurl multi handle, claimed and recorded in batches.

In-process tests drive an Engine directly against real PostgreSQL and real receivers; the last one
stops a real worker with attempts in flight.
"""
import contextlib
import os
import signal
import threading
import time

import pytest
from django.db import connection

from tests.conftest import other_session, wait_until
from tests.processes import celery_worker
from tests.receiver import Answer
from webhooks.models import Delivery, DeliveryAttempt

pytestmark = pytest.mark.django_db(transaction=True)


def _deliveries(api, url, count, **endpoint):
    """`count` events for a new endpoint at `url`, of a type only that endpoint subscribes to."""
    event_type = "t" + url.rsplit("/", 1)[-1] + ".happened"
    response = api.post("endpoints", {"url": url, "event_types": [event_type], **endpoint})
    assert response.status_code == 201, response.content
    return [api.delivery_id(event_type, {"n": n}) for n in range(count)]


def _statuses(ids):
    return dict(Delivery.objects.filter(pk__in=ids).values_list("id", "status"))


def test_attempts_overlap_and_each_is_recorded_once(api, receiver, engine):
    ids = _deliveries(api, receiver.url(), 30, max_in_flight=100)
    receiver.script("/hook", *[Answer(delay=0.5)] * 30)
    started = time.monotonic()
    assert engine.run(ids)
    elapsed = time.monotonic() - started
    assert set(_statuses(ids).values()) == {"succeeded"}
    assert elapsed < 2.5, f"30 attempts to a 0.5 s receiver took {elapsed:.1f}s: they did not overlap"
    assert receiver.path_max_in_flight["/hook"] >= 20
    assert DeliveryAttempt.objects.filter(delivery_id__in=ids).count() == 30


def test_a_batch_of_claims_respects_the_cap_and_freed_slots_are_taken_without_the_broker(api, receiver, broker,
                                                                                         engine):
    ids = _deliveries(api, receiver.url(), 8, max_in_flight=3)
    broker.clear()
    receiver.script("/hook", *[Answer(delay=0.3)] * 8)
    assert engine.run(ids)  # all in one turn of the engine, so one batch claim: 3 go, 5 are parked
    # each finished attempt gave its slot to a parked delivery, which the engine claimed itself
    assert set(_statuses(ids).values()) == {"succeeded"}
    assert receiver.path_max_in_flight["/hook"] == 3
    assert len(receiver.received) == 8
    assert broker.delivery_ids() == []


@contextlib.contextmanager
def _outbox_inserts():
    """The delivery ids of the outbox rows written while the block runs (a trigger on the real table, dropped
    after): each handed-on delivery the record claims itself needs none, each one left to the engine's or the
    broker's message does."""
    written: list[str] = []
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE test_outbox_inserts (delivery_id varchar)")
        cursor.execute("""CREATE FUNCTION test_outbox_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
                          BEGIN INSERT INTO test_outbox_inserts VALUES (NEW.delivery_id); RETURN NEW; END $$""")
        cursor.execute("CREATE TRIGGER test_outbox_inserted AFTER INSERT OR UPDATE ON webhooks_deliveryoutbox "
                       "FOR EACH ROW EXECUTE FUNCTION test_outbox_inserted()")
    try:
        yield written
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT delivery_id FROM test_outbox_inserts")
            written += [row[0] for row in cursor.fetchall()]
            cursor.execute("DROP TRIGGER test_outbox_inserted ON webhooks_deliveryoutbox")
            cursor.execute("DROP FUNCTION test_outbox_inserted()")
            cursor.execute("DROP TABLE test_outbox_inserts")


def test_a_record_claims_what_it_hands_on_and_still_publishes_it(api, receiver, broker, engine):
    """The five deliveries parked behind a cap of 3, and two behind a throttle and a cap of 1, are each handed
    a freed slot by a record, which claims them in its transaction; each still gets its outbox row (published),
    which brings it back if that claim, on the record's clock, found it not yet due. The throttled endpoint's
    still start its interval apart."""
    ids = _deliveries(api, receiver.url("/capped"), 8, max_in_flight=3)
    throttled = _deliveries(api, receiver.url("/paced"), 3, max_in_flight=1, throttle_rate=2)
    broker.clear()
    receiver.script("/capped", *[Answer(delay=0.3)] * 8)
    receiver.script("/paced", *[Answer(delay=0.7)] * 3)  # each record comes after the throttle allows the next
    with _outbox_inserts() as written:
        assert engine.run(ids + throttled)
    assert set(_statuses(ids + throttled).values()) == {"succeeded"}
    assert receiver.path_max_in_flight["/capped"] == 3
    assert Delivery.objects.filter(pk__in=ids + throttled, parked_at__isnull=False).count() == 0
    assert set(written) == set(ids[3:] + throttled[1:])
    starts = sorted(a.started_at for a in DeliveryAttempt.objects.filter(delivery_id__in=throttled))
    assert min(later - earlier for earlier, later in zip(starts, starts[1:])).total_seconds() >= 0.5
    assert broker.delivery_ids() == []


def test_timeouts_errors_and_private_addresses_on_the_multi_handle(api, receiver, engine, settings):
    settings.WEBHOOK_RETRY_SCHEDULE = "1,60"  # a Retry-After may push a retry up to the longest step
    hanging = _deliveries(api, receiver.url("/hang"), 2, max_in_flight=10)
    receiver.script("/hang", *[Answer(delay=10)] * 2)
    failing = _deliveries(api, receiver.url("/fail"), 2)
    receiver.script("/fail", 500, Answer(status=503, headers=(("Retry-After", "7"),)))
    ok = _deliveries(api, receiver.url("/ok"), 2)
    started = time.monotonic()
    assert engine.run(hanging + failing + ok)
    assert time.monotonic() - started < 4  # WEBHOOK_TIMEOUT_SECONDS is 2 in tests
    attempts = {a.delivery_id: a for a in DeliveryAttempt.objects.filter(delivery_id__in=hanging + failing + ok)}
    assert all("timeout" in attempts[i].error and attempts[i].response_status is None for i in hanging)
    # sent together, so either may have arrived first and got the first scripted answer
    by_status = {attempts[i].response_status: i for i in failing}
    assert sorted(by_status) == [500, 503]
    assert all(attempts[i].response_status == 200 for i in ok)
    assert set(_statuses(ok).values()) == {"succeeded"}
    assert set(_statuses(hanging + failing).values()) == {"pending"}
    # the 503's Retry-After pushed its next attempt later than the 1 s step of the test schedule
    throttled = by_status[503]
    retry = Delivery.objects.get(pk=throttled).next_attempt_at
    assert (retry - attempts[throttled].started_at).total_seconds() > 6


def test_only_4_kib_of_an_answer_is_kept_on_the_multi_handle(api, receiver, engine):
    ids = _deliveries(api, receiver.url("/big"), 2)
    receiver.script("/big", Answer(body=b"x" * 100_000), Answer(body=b"y" * 10))
    assert engine.run(ids)
    bodies = sorted(DeliveryAttempt.objects.filter(delivery_id__in=ids).values_list("response_body", flat=True))
    assert bodies == ["x" * 4096, "y" * 10]
    assert set(_statuses(ids).values()) == {"succeeded"}


def test_a_private_address_is_refused_at_connect_time_on_the_multi_handle(api, receiver, engine, settings):
    blocked = _deliveries(api, receiver.url("/private"), 1)  # accepted while private networks were allowed
    settings.WEBHOOK_ALLOW_PRIVATE_NETWORKS = False
    engine.submit(blocked[0])
    assert engine.drain(10)
    (attempt,) = DeliveryAttempt.objects.filter(delivery_id=blocked[0])
    assert attempt.error.startswith("blocked_address") and attempt.response_status is None
    assert receiver.received == []


def test_a_database_outage_in_a_batch_loses_nothing(api, receiver, engine):
    ids = _deliveries(api, receiver.url(), 3)
    with connection.cursor() as cursor:  # the engine's claims fail while the function is missing
        cursor.execute("ALTER FUNCTION herald_delivery_claim_many(varchar[], double precision, integer) "
                       "RENAME TO herald_delivery_claim_many_away")
    try:
        assert engine.run(ids)  # the failed batch gave its slots back
        assert set(_statuses(ids).values()) == {"pending"} and receiver.received == []
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER FUNCTION herald_delivery_claim_many_away(varchar[], double precision, integer) "
                           "RENAME TO herald_delivery_claim_many")
    assert engine.run(ids)  # what the dispatcher would publish again
    assert set(_statuses(ids).values()) == {"succeeded"}


def _record_waits_on(locker) -> bool:
    """Whether this database's record of a batch is waiting on the lock `locker` (a session) holds."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND query LIKE '%%herald_delivery_record_many%%' AND %s = ANY(pg_blocking_pids(pid))",
                       [locker.info.backend_pid])
        return cursor.fetchone()[0] > 0


def _claim_waits() -> bool:
    """Whether this database's claim of a batch is waiting on a lock (queued behind a record waiting for the same
    row, it waits on that record's tuple lock, not on the holder's)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND query LIKE '%%herald_delivery_claim_many%%' AND wait_event_type = 'Lock'")
        return cursor.fetchone()[0] > 0


def test_a_record_that_waits_does_not_hold_up_the_next_claims(api, receiver, engine):
    """Finished attempts go to the engine's recorder thread: while one record waits (here on its endpoint's row,
    locked by another transaction), the engine goes on claiming and sending."""
    held = _deliveries(api, receiver.url("/held"), 1)
    endpoint_id = Delivery.objects.get(pk=held[0]).endpoint_id
    other = _deliveries(api, receiver.url("/other"), 1)
    locker = other_session(autocommit=False)
    locked = threading.Event()

    def lock_the_endpoint(received):  # on the receiver's thread, before it answers (0.2 s later)
        if received.path == "/held":
            locker.execute("SELECT 1 FROM webhooks_endpoint WHERE id = %s FOR NO KEY UPDATE", [endpoint_id])
            locked.set()

    receiver.on_request = lock_the_endpoint
    receiver.script("/held", Answer(delay=0.2))
    try:
        engine.submit(held[0])
        assert locked.wait(10)
        wait_until(lambda: _record_waits_on(locker), 10, message="the record of /held waiting on its endpoint's lock")
        engine.submit(other[0])
        receiver.wait_for(1, "/other", timeout=5)  # claimed and sent while that record still waits
        assert _statuses(held) == {held[0]: "pending"} and _record_waits_on(locker)
    finally:
        receiver.on_request = None
        locker.rollback()
        locker.close()
    assert engine.drain(10)
    assert _statuses(held + other) == {held[0]: "succeeded", other[0]: "succeeded"}


def test_a_slot_a_record_frees_goes_to_the_parked_delivery_not_to_a_claim_waiting_beside_it(api, receiver, engine):
    """The record that frees a slot claims the parked delivery it hands the slot to in its own transaction: a
    fresh delivery's claim, queued on the same endpoint lock at the same moment, finds the slot taken and
    parks, and the three go out in their order. (Were the handed-on delivery claimed afterwards, the fresh
    claim, next in the lock's queue, would take the slot and park it again.)"""
    first, second, third = _deliveries(api, receiver.url("/one"), 3, max_in_flight=1)
    endpoint_id = Delivery.objects.get(pk=first).endpoint_id
    locker = other_session(autocommit=False)
    receiver.script("/one", Answer(delay=0.3), Answer(delay=0.3), Answer(delay=0.3))
    try:
        engine.submit(first)
        receiver.wait_for(1, "/one", timeout=5)
        engine.submit(second)  # the endpoint is at its cap of 1: parked
        wait_until(lambda: Delivery.objects.filter(pk=second, parked_at__isnull=False).exists(), 10,
                   message="the second delivery parked")
        locker.execute("SELECT 1 FROM webhooks_endpoint WHERE id = %s FOR NO KEY UPDATE", [endpoint_id])
        wait_until(lambda: _record_waits_on(locker), 10, message="the first attempt's record waiting on the lock")
        engine.submit(third)  # its claim queues on the same lock, behind the record
        wait_until(_claim_waits, 10, message="the third's claim queued on the lock behind the record")
    finally:
        locker.rollback()
        locker.close()
    assert engine.drain(15)
    assert _statuses([first, second, third]) == dict.fromkeys([first, second, third], "succeeded")
    arrived = [r.headers["webhook-id"] for r in receiver.requests_to("/one")]
    events = dict(Delivery.objects.filter(pk__in=[first, second, third]).values_list("id", "event_id"))
    assert arrived == [events[first], events[second], events[third]]
    assert receiver.path_max_in_flight["/one"] == 1


@pytest.mark.slow
def test_a_worker_stopped_with_attempts_in_flight_finishes_and_records_them(api, receiver):
    worker = celery_worker("draining", concurrency=None)
    try:
        ids = _deliveries(api, receiver.url(), 5, max_in_flight=10)
        receiver.script("/hook", *[Answer(delay=1.0)] * 5)
        receiver.wait_for(5)
        os.killpg(worker.popen.pid, signal.SIGTERM)  # what `docker compose stop` sends
        worker.popen.wait(15)
    finally:
        worker.stop()
    assert set(_statuses(ids).values()) == {"succeeded"}
    assert len(receiver.received) == 5
    assert DeliveryAttempt.objects.filter(delivery_id__in=ids).count() == 5
