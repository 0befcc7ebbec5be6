"""Per-endpoint ordering (fifo) and throttling, in-process through an Engine and through real workers; the
scenarios that take a `sink` run once per destination kind (tests/sinks.py)."""
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db.models.functions import Now

from tests.conftest import all_succeeded, create_endpoint, other_session, wait_until
from tests.processes import celery_beat, celery_worker
from tests.receiver import Answer
from webhooks.models import Delivery, DeliveryAttempt, DeliveryLease
from webhooks.delivery.dispatcher import deliveries_dispatch_due
from webhooks.delivery.pacing import Pacing

pytestmark = pytest.mark.django_db(transaction=True)


def _post(api, event_type, count):
    return [api.delivery_id(event_type, {"n": n}) for n in range(count)]


def _event_order(ids):
    return list(Delivery.objects.filter(pk__in=ids).order_by("id").values_list("event_id", flat=True))


def _first_successes(receiver, path):
    """webhook-ids in the order of their first 2xx at the receiver."""
    seen = []
    for request in receiver.requests_to(path):
        if request.headers["webhook-id"] not in seen and request.answered_ok:
            seen.append(request.headers["webhook-id"])
    return seen


def _arrivals(sink, path):
    return [a.headers["webhook-id"] for a in sink.received(path)]


def _one_at_a_time(ids) -> bool:
    """Each attempt started after the one before it ended, as Herald recorded them (whatever the kind)."""
    attempts = sorted(DeliveryAttempt.objects.filter(delivery_id__in=ids), key=lambda a: a.started_at)
    return all((b.started_at - a.started_at).total_seconds() * 1000 >= a.duration_ms - 1
               for a, b in zip(attempts, attempts[1:]))


def _max_per_second(times):
    times = sorted(times)
    return max((sum(1 for t in times if start <= t < start + 1.0) for start in times), default=0)


def _sent_as_started(arrivals, ids) -> list[float]:
    """The starts Herald recorded are when it sent: each delivery's one message arrived after its attempt's
    start and soon after (one clock: this machine's). How many arrive in a second is the loopback's jitter on a
    busy machine, not the throttle's rule (SPEC: attempts *start* no more than that many per second), which the
    tests check on the recorded starts. Returns the arrival times."""
    wall_minus_monotonic = time.time() - time.monotonic()
    arrived = {a.headers["webhook-id"]: a.at + wall_minus_monotonic for a in arrivals}
    started = dict(DeliveryAttempt.objects.filter(delivery_id__in=ids).values_list("delivery__event_id",
                                                                                    "started_at"))
    assert arrived.keys() == started.keys() and len(arrived) == len(ids) == len(arrivals)
    lags = [arrived[event_id] - started[event_id].timestamp() for event_id in started]
    assert -0.05 <= min(lags) and max(lags) < 2.0, f"start to arrival: {min(lags):.3f}..{max(lags):.3f} s"
    return list(arrived.values())


def test_a_fifo_endpoint_receives_one_at_a_time_in_event_order(api, sink, engine):
    create_endpoint(api, **sink.endpoint_fields("/fifo"), event_types=["fifo.*"], ordering="fifo", max_in_flight=50)
    ids = _post(api, "fifo.happened", 8)
    assert engine.run(reversed(ids), 15)  # handed over newest first, in one batch: order is the endpoint's job
    assert all_succeeded(ids)
    sink.wait_for(8, "/fifo")
    assert _arrivals(sink, "/fifo") == _event_order(ids)
    assert _one_at_a_time(ids)


def test_a_failing_head_holds_the_rest_until_its_retry_succeeds(api, sink, engine):
    create_endpoint(api, **sink.endpoint_fields("/fifo"), event_types=["fifo.*"], ordering="fifo")
    ids = _post(api, "fifo.happened", 5)
    sink.down("/fifo")  # the head's first attempt fails
    assert engine.run(ids, 15)
    # the head failed and waits for its retry (1 s in tests); the others are parked behind it
    assert DeliveryAttempt.objects.filter(delivery_id__in=ids).count() == 1
    assert DeliveryAttempt.objects.get().delivery_id == ids[0]
    assert Delivery.objects.filter(pk__in=ids[1:], parked_at__isnull=False).count() == 4
    sink.up("/fifo")
    wait_until(lambda: Delivery.objects.filter(pk=ids[0], next_attempt_at__lte=Now()).exists(), timeout=30,
               message="the head's retry coming due by PostgreSQL's clock")
    assert engine.run(deliveries_dispatch_due(), 15)  # what beat does: the head's retry has come due
    assert all_succeeded(ids)
    sink.wait_for(5, "/fifo")
    assert _arrivals(sink, "/fifo") == _event_order(ids)
    assert DeliveryAttempt.objects.get(delivery_id=ids[1]).number == 1  # waiting used up no retry step


def test_a_manual_retry_of_an_earlier_delivery_goes_next_and_reorders_nothing_delivered(api, receiver, engine):
    create_endpoint(api, receiver.url("/fifo"), event_types=["fifo.*"], ordering="fifo")
    ids = _post(api, "fifo.happened", 3)
    assert engine.run(ids, 15) and all_succeeded(ids)
    retried = api.post(f"deliveries/{ids[0]}/retry").json()
    assert retried["status"] == "pending"
    later = _post(api, "fifo.happened", 1)
    assert engine.run(later + [ids[0]], 15)  # the new event's task may well run first
    arrivals = [r.headers["webhook-id"] for r in receiver.requests_to("/fifo")]
    assert arrivals == _event_order(ids) + _event_order(ids[:1]) + _event_order(later)


def test_switching_to_fifo_applies_from_the_next_claim(api, receiver, engine):
    endpoint = create_endpoint(api, receiver.url("/switch"), event_types=["switch.*"])
    assert endpoint["ordering"] == "unordered"
    assert api.patch(f"endpoints/{endpoint['id']}", {"ordering": "fifo"}).json()["ordering"] == "fifo"
    ids = _post(api, "switch.happened", 6)
    receiver.script("/switch", *[Answer(delay=0.05)] * 6)
    assert engine.run(ids, 15)
    assert receiver.path_max_in_flight["/switch"] == 1
    assert [r.headers["webhook-id"] for r in receiver.requests_to("/switch")] == _event_order(ids)


def test_a_throttled_endpoint_starts_no_more_than_its_rate_and_holds_back_no_other(api, sink, engine):
    create_endpoint(api, **sink.endpoint_fields("/slowly"), event_types=["slowly.*"], throttle_rate=10)
    create_endpoint(api, **sink.endpoint_fields("/freely"), event_types=["freely.*"])
    throttled = _post(api, "slowly.happened", 25)
    free = _post(api, "freely.happened", 20)
    started = time.monotonic()
    for delivery_id in throttled + free:
        engine.submit(delivery_id)
    wait_until(lambda: all_succeeded(free), timeout=20)
    free_done = time.monotonic() - started
    # parked deliveries hold no slot of the engine: it wakes the endpoint when the next one may start
    wait_until(lambda: all_succeeded(throttled), timeout=30, interval=0.02)
    elapsed = time.monotonic() - started
    # held back behind the throttled endpoint, the free ones would wait for its 2.4 s; the bounds keep margins
    # for a loaded machine (the rate itself is checked exactly below, from Herald's own start times)
    assert free_done < 2.0, f"an unthrottled endpoint waited {free_done:.1f}s"
    assert 2.3 <= elapsed < 10, f"25 attempts at 10/s took {elapsed:.1f}s"
    starts = [a.started_at.timestamp() for a in DeliveryAttempt.objects.filter(delivery_id__in=throttled)]
    assert _max_per_second(starts) <= 10  # as Herald started them
    _sent_as_started(sink.wait_for(25, "/slowly"), throttled)


def test_a_throttled_endpoint_goes_on_when_a_record_hands_one_on_while_a_wake_up_is_pending(api, receiver, engine):
    """A record may hand a parked delivery on (the throttle allows a start by the time the record runs: a slow
    turn of the engine) while the engine's wake-up for the throttle's earlier time is still pending; that
    delivery's claim moves the throttle on. The later time must get a wake-up of its own: the earlier one
    finds no room, and nothing else would hand the last delivery on (beat is not running). The order is
    made certain here: this session holds the endpoint's row lock, which the record needs, and moves the
    throttle's time back, as it is when a record comes after it."""
    endpoint = create_endpoint(api, receiver.url("/paced"), event_types=["paced.*"], throttle_rate=1)
    # the first attempt ends half-way to the throttle's next start: this session has locked the endpoint by
    # then, and the record waits for the lock well before the wake-up is due
    receiver.script("/paced", Answer(delay=0.5))
    first, second, third = _post(api, "paced.happened", 3)
    for delivery_id in (first, second, third):
        engine.submit(delivery_id)
    wait_until(lambda: DeliveryLease.objects.filter(delivery_id=first).exists()
               and Delivery.objects.filter(pk__in=[second, third], parked_at__isnull=False).count() == 2)
    with other_session(autocommit=False) as other, other_session() as look:
        other.execute("UPDATE webhooks_endpoint SET throttle_tat = now() WHERE id = %s", [endpoint["id"]])

        def record_waits():
            return look.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                " AND query LIKE '%herald_delivery_record%'").fetchone()[0] == 1

        wait_until(record_waits, message="the first attempt's record waiting for the endpoint's lock")
        other.commit()
    # the record hands the second on, whose claim moves the throttle on by a second; the third goes then
    wait_until(lambda: all_succeeded([first, second, third]), timeout=15, message="the three deliveries")
    starts = dict(DeliveryAttempt.objects.filter(delivery_id__in=[second, third]).values_list("delivery_id",
                                                                                             "started_at"))
    assert (starts[third] - starts[second]).total_seconds() >= 0.99, starts


@pytest.mark.slow
def test_fifo_order_and_throttle_hold_across_two_workers(api, receiver, processes):
    processes(celery_worker("left", concurrency=None))
    processes(celery_worker("right", concurrency=None))
    processes(celery_beat())
    create_endpoint(api, receiver.url("/fifo"), event_types=["fifo.*"], ordering="fifo")
    create_endpoint(api, receiver.url("/paced"), event_types=["paced.*"], throttle_rate=10)
    # the 10th, 11th and 12th requests to the fifo endpoint fail: its head holds the rest until they pass
    receiver.script("/fifo", *[200] * 9, 500, 500, 500)
    fifo = _post(api, "fifo.happened", 40)
    paced = _post(api, "paced.happened", 40)
    wait_until(lambda: all_succeeded(fifo + paced), timeout=60, message="fifo and paced deliveries")
    assert _first_successes(receiver, "/fifo") == _event_order(fifo)
    assert receiver.path_max_in_flight["/fifo"] == 1
    # the throttle is on starts, across both workers: as Herald started them, never more than 10 in a second
    starts = [a.started_at.timestamp() for a in DeliveryAttempt.objects.filter(delivery_id__in=paced)]
    assert _max_per_second(starts) <= 10
    arrived = _sent_as_started(receiver.requests_to("/paced"), paced)
    assert max(arrived) - min(arrived) >= 3.8  # 40 at 10/s


def test_the_engine_starts_a_throttled_endpoints_attempts_an_interval_apart_however_late_each_claim_comes():
    """The claim moves the throttle on by the interval from the claim's own time; the engine starts an attempt
    some milliseconds after its claim (the claimer thread's or a record's transaction, then its next turn), not
    always the same few. A claim that reaches it sooner after its own claim time than the one before must wait
    for the rest of the interval since that one's start; another endpoint's claim does not."""
    pacing = Pacing()
    first, second, other = [(SimpleNamespace(endpoint_id=e), None) for e in ("e", "e", "o")]
    interval = timedelta(seconds=0.1)
    assert pacing.start_now(first, interval, 10.03)  # claimed at 10.00, started 30 ms later
    assert not pacing.start_now(second, interval, 10.10)  # claimed at 10.10, reached the engine at once
    assert pacing.start_now(other, interval, 10.10)
    assert pacing.next_at() == pytest.approx(10.13)
    assert pacing.due(10.129) == []
    assert pacing.due(10.13) == [second]
    assert not pacing.waiting
