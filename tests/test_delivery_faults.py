"""Nothing is lost and nothing is sent twice at once: crashes, broker loss and duplicate tasks."""
import re
import time
from datetime import timedelta

import pytest
import requests
from django.conf import settings
from django.db.models.functions import Now

from tests.conftest import all_succeeded, create_endpoint, wait_until
from tests.processes import RedisServer, celery_beat, celery_worker, free_port, gunicorn
from tests.receiver import Answer
from webhooks.models import Delivery, DeliveryAttempt, DeliveryLease, DeliveryOutbox
from webhooks.tasks import deliver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_worker_killed_mid_delivery_loses_nothing(api, receiver, processes):
    # given a worker in the middle of a slow delivery
    processes(celery_beat())
    doomed = processes(celery_worker("doomed"))
    create_endpoint(api, receiver.url())
    receiver.script("/hook", Answer(delay=30))
    event = api.send_event("invoice.paid")
    receiver.wait_for(1)
    delivery_id = event["deliveries"][0]["id"]
    leased_until = DeliveryLease.objects.get(delivery_id=delivery_id).until  # the doomed worker's claim

    # when it is killed outright and another worker starts
    doomed.kill()
    processes(celery_worker("heir"))

    # then the delivery is sent again once the lease (4 s in tests) runs out, not before, and succeeds
    wait_until(lambda: all_succeeded([delivery_id]), timeout=60, message="redelivery after the crash")
    requests_seen = receiver.requests_to("/hook")
    assert len(requests_seen) == 2
    assert {r.headers["webhook-id"] for r in requests_seen} == {event["id"]}
    (resent,) = DeliveryAttempt.objects.filter(delivery_id=delivery_id)  # the killed attempt recorded nothing
    assert resent.started_at >= leased_until


def test_a_redis_flush_before_any_worker_ran_loses_nothing(api, receiver, processes, broker):
    create_endpoint(api, receiver.url())
    ids = [d["id"] for n in range(5)
           for d in api.send_event("invoice.paid", {"n": n})["deliveries"]]
    assert sorted(broker.delivery_ids()) == sorted(ids)
    broker.redis.flushdb()
    assert broker.delivery_ids() == []

    processes(celery_worker("after-flush"))
    processes(celery_beat())
    wait_until(lambda: all_succeeded(ids), timeout=30, message="deliveries after the flush")
    assert sorted(r.headers["webhook-id"] for r in receiver.received) == sorted(
        Delivery.objects.filter(pk__in=ids).values_list("event_id", flat=True))


@pytest.mark.redis_only
def test_intake_answers_202_while_redis_is_down_and_deliveries_arrive_after(api, receiver, processes):
    broker = RedisServer()
    broker.start()
    env = {"CELERY_BROKER_URL": broker.url}
    port = free_port()
    processes(gunicorn(port, **env))
    processes(celery_worker("broker-loss", **env))
    processes(celery_beat(**env))
    create_endpoint(api, receiver.url())

    try:
        broker.stop()
        answers = []
        for n in range(3):
            started = time.monotonic()
            answers.append(requests.post(
                f"http://127.0.0.1:{port}/api/v1/events", json={"type": "invoice.paid", "data": {"n": n}},
                headers={"Authorization": f"Bearer {api.token}", "Idempotency-Key": f"redis-down-{n:04d}"},
                timeout=30))
            assert time.monotonic() - started < 10
        assert [a.status_code for a in answers] == [202, 202, 202]
        ids = [a.json()["deliveries"][0]["id"] for a in answers]
        assert receiver.received == []
    finally:
        broker.start()
        processes(broker.process)  # stopped with the others when the test ends: no redis-server left behind
    wait_until(lambda: all_succeeded(ids), timeout=40, message="deliveries once redis is back")
    assert len(receiver.received) == 3


def _tasks_run(worker, task: str) -> int:
    """How many `task` tasks the worker ran to the end (Celery logs each: `Task <name>[<id>] succeeded`)."""
    return len(re.findall(rf"Task {re.escape(task)}\[[^\]]+\] succeeded", worker.output()))


def test_two_workers_and_duplicated_tasks_never_send_one_delivery_concurrently(api, receiver, processes):
    workers = [processes(celery_worker("left", concurrency=2)), processes(celery_worker("right", concurrency=2))]
    create_endpoint(api, receiver.url())
    receiver.script("/hook", *[Answer(delay=0.4)] * 6)
    ids = [api.delivery_id("invoice.paid", {"n": n}) for n in range(6)]
    for delivery_id in ids:  # the same task, published again and again
        for _ in range(4):
            deliver.delay(delivery_id)

    wait_until(lambda: all_succeeded(ids), timeout=60)
    # the duplicates have run out (not "half a second later"): the workers ran all 24 duplicated tasks, then
    # stop gracefully, each draining its engine (every delivery a task handed it is finished)
    wait_until(lambda: sum(_tasks_run(worker, "webhooks.deliver") for worker in workers) == 24, timeout=60,
               message="both workers running the 24 duplicated tasks")
    for worker in workers:
        worker.stop(grace=30)
        assert "engine.drain_timed_out" not in worker.output()
    assert len(receiver.received) == 6
    assert set(receiver.max_in_flight.values()) == {1}
    assert all(d.attempt_count == 1 for d in Delivery.objects.filter(pk__in=ids))


def test_a_private_address_is_refused_at_connect_time(api, receiver, processes):
    # the endpoint was accepted while private networks were allowed; the worker no longer allows them
    create_endpoint(api, receiver.url())
    create_endpoint(api, f"http://localhost:{receiver.port}/by-name", event_types=["invoice.*"])
    processes(celery_worker("strict", WEBHOOK_ALLOW_PRIVATE_NETWORKS="false"))
    event = api.send_event("invoice.paid")
    ids = [d["id"] for d in event["deliveries"]]
    wait_until(lambda: all(Delivery.objects.get(pk=i).attempt_count for i in ids))
    for delivery_id in ids:
        (attempt,) = api.get(f"deliveries/{delivery_id}").json()["attempts"]
        assert attempt["response_status"] is None and "blocked" in attempt["error"]
    assert receiver.received == []


def test_a_recovered_delivery_is_not_held_back_by_a_backlog(api, receiver, processes, broker):
    # given a delivery whose task was lost (removed from Redis) ...
    create_endpoint(api, receiver.url("/slow"), event_types=["slow.*"])
    create_endpoint(api, receiver.url("/lost"), event_types=["lost.*"])
    lost = api.delivery_id("lost.thing")
    (message,) = [raw for raw, _, args in broker.messages(settings.CELERY_TASK_DEFAULT_QUEUE) if lost in args[0]]
    broker.redis.lrem(settings.CELERY_TASK_DEFAULT_QUEUE, 1, message)
    # ... and, queued after it (the redispatch window later), about 12 s of slow deliveries for a
    # one-process worker
    window = timedelta(seconds=settings.WEBHOOK_REDISPATCH_AFTER_SECONDS + 0.5)
    wait_until(lambda: DeliveryOutbox.objects.filter(delivery_id=lost, published_at__lt=Now() - window).exists(),
               timeout=30, message="the lost delivery's publish to pass the redispatch window")
    receiver.script("/slow", *[Answer(delay=0.8)] * 15)
    slow = []
    for n in range(15):  # one message each (a relay publishing them together would make one message)
        slow.append(api.delivery_id("slow.thing", {"n": n}))
        broker.relay()
    # beat first, sending its dispatcher's ticks (logged at DEBUG), so that a slow start of beat on a loaded machine
    # is not what is measured (the ticks themselves run on the worker, once it is up)
    beat = processes(celery_beat(loglevel="DEBUG"))
    beat.wait_for_output("webhooks.dispatch_due", timeout=60)
    processes(celery_worker("backlogged"))

    # then beat's dispatcher finds it lost (once the worker took what was published after it) and it is sent
    # long before the backlog drains
    receiver.wait_for(1, "/lost", timeout=30)  # the count below says "before the backlog drains"
    # held back by the backlog, it would come after all 15; how many come before it depends on when the worker's
    # one thread runs the dispatcher's tick between them (14 were seen at a load average of 12)
    assert len(receiver.requests_to("/slow")) < 15
    # and the slow ones, still waiting in the queue, were not published a second time
    wait_until(lambda: all_succeeded(slow), timeout=30)
    assert len(receiver.requests_to("/slow")) == 15
    assert all(d.attempt_count == 1 for d in Delivery.objects.filter(pk__in=slow))


def test_a_publish_the_broker_refused_is_unmarked_and_sent_when_it_is_back_without_beat(api, receiver, processes):
    """The relay marks a batch published, then the broker fails: the batch is made due again at once, so the
    next relay pass publishes it (no beat runs here, and the dispatcher's lost check is an hour away)."""
    broker = RedisServer()
    broker.start()
    env = {"CELERY_BROKER_URL": broker.url, "WEBHOOK_REDISPATCH_AFTER_SECONDS": 3600}
    worker = processes(celery_worker("unmark", **env))
    create_endpoint(api, receiver.url())
    try:
        broker.stop()
        delivery_id = api.delivery_id("invoice.paid")
        # each relay pass publishes it again, and fails again: it was due again (unpublished), not left marked
        # (a marked row is published again only by the dispatcher's lost check, an hour away here)
        def failed_publishes() -> int:
            lines = worker.output().splitlines()
            return sum(delivery_id in line for line in lines if "delivery.enqueue_failed" in line)

        wait_until(lambda: failed_publishes() >= 3, timeout=30, message="three failed publishes of the delivery")
        outbox = DeliveryOutbox.objects.filter(delivery_id=delivery_id)
        assert outbox.exists()
    finally:
        broker.start()
        processes(broker.process)
    wait_until(lambda: all_succeeded([delivery_id]), timeout=20, message="the delivery once the broker is back")
    assert len(receiver.received) == 1
