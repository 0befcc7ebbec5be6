"""Beat's dispatcher against real PostgreSQL and Redis: what it publishes, and what it leaves in a queue.

A delivery published and never claimed is lost only once its queue no longer holds it: the queue is
empty, or the workers have consumed messages published a redispatch window after it (queues are
first in, first out). A long backlog waiting its turn is never published twice, however the ids
were grouped into messages.
"""
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from tests.conftest import all_succeeded, create_endpoint, wait_until
from tests.processes import celery_worker
from webhooks import progress
from webhooks.models import Delivery, DeliveryLease, DeliveryOutbox, QueueProgress
from webhooks.delivery.dispatcher import deliveries_dispatch_due
from webhooks.delivery.outbox import TAKE_SQL
from webhooks.delivery.publishing import deliveries_enqueue

pytestmark = pytest.mark.django_db(transaction=True)
MAIN = settings.CELERY_TASK_DEFAULT_QUEUE


def _deliveries(api, count):
    return [api.delivery_id("invoice.paid", {"n": n}) for n in range(count)]


def _published_ago(ids, seconds):
    """As if these first attempts had been created and published `seconds` ago."""
    at = timezone.now() - timedelta(seconds=seconds)
    Delivery.objects.filter(pk__in=ids).update(created_at=at, next_attempt_at=at)
    assert DeliveryOutbox.objects.filter(delivery_id__in=ids).update(due_at=at, published_at=at) == len(ids)


def test_a_backlog_in_a_queue_is_left_alone_however_its_ids_are_grouped(api, broker, settings):
    settings.WEBHOOK_ENQUEUE_CHUNK = 7  # one message holds up to seven deliveries
    create_endpoint(api, "https://a.example.com/")
    ids = _deliveries(api, 20)
    broker.clear()
    _published_ago(ids, 600)
    deliveries_enqueue(delivery_ids=ids, wait=True)  # three messages for twenty deliveries
    assert len(broker.published(MAIN)) == 3
    # the workers are busy with older work: they have consumed up to twenty minutes ago
    progress.flush({MAIN: timezone.now() - timedelta(minutes=20)})
    assert deliveries_dispatch_due() == []
    # once they consume past the backlog, whatever of it is still unclaimed was lost
    progress.flush({MAIN: timezone.now() - timedelta(minutes=5)})
    assert sorted(deliveries_dispatch_due()) == sorted(ids)


def test_a_message_lost_from_an_empty_queue_is_published_again_after_the_window(api, broker, settings):
    create_endpoint(api, "https://a.example.com/")
    _deliveries(api, 1)
    (old,) = _deliveries(api, 1)
    broker.clear()  # published, and then a flush: both messages lost
    _published_ago([old], settings.WEBHOOK_REDISPATCH_AFTER_SECONDS + 1)
    assert deliveries_dispatch_due() == [old]  # the fresh one may still be in a worker's hands
    assert [i for _, args in broker.published(settings.HERALD_PERIODIC_QUEUE) for i in args[0]] == [old]
    assert deliveries_dispatch_due() == []  # published once, not on every run


def test_the_marks_workers_consume_are_kept_per_queue_and_only_move_forward():
    later = timezone.now()
    progress.flush({MAIN: later, "other": later - timedelta(hours=1)})
    progress.flush({MAIN: later - timedelta(minutes=1)})  # another worker, further behind
    assert progress.consumed_marks() == {MAIN: later, "other": later - timedelta(hours=1)}
    assert QueueProgress.objects.count() == 2


def test_due_retries_go_out_in_full_batches_within_one_run_and_later_ones_are_not_touched(api, broker, settings):
    create_endpoint(api, "https://a.example.com/")
    ids = _deliveries(api, 25)
    broker.clear()
    now = timezone.now()
    # twenty retries have come due, five are scheduled for later (as a record of a failed attempt leaves them)
    for some, at in ((ids[:20], now - timedelta(seconds=1)), (ids[20:], now + timedelta(hours=1))):
        Delivery.objects.filter(pk__in=some).update(attempt_count=1, next_attempt_at=at)
        DeliveryOutbox.objects.filter(delivery_id__in=some).update(due_at=at, published_at=None, periodic=True)
    counter = _Counter()
    with connection.execute_wrapper(counter):
        published = deliveries_dispatch_due(batch=6)
    assert sorted(published) == sorted(ids[:20])
    assert counter.relayed == 4  # batches of 6, 6, 6 and 2, one after the other
    assert DeliveryOutbox.objects.filter(delivery_id__in=ids[20:], published_at__isnull=True).count() == 5
    # retries, so in the periodic queue
    assert sorted(i for _, args in broker.published(settings.HERALD_PERIODIC_QUEUE) for i in args[0]) == sorted(ids[:20])


def test_a_delivery_whose_worker_died_is_published_again_when_its_lease_runs_out(api, broker):
    create_endpoint(api, "https://a.example.com/")
    (delivery_id,) = _deliveries(api, 1)
    broker.clear()
    # claimed a moment ago (with a lease that has already run out) by a worker that died since
    with connection.cursor() as cursor:
        cursor.execute("SELECT go FROM herald_delivery_claim(%s, -1, 10)", [delivery_id])
        assert cursor.fetchone() == (True,)
    assert not DeliveryOutbox.objects.filter(delivery_id=delivery_id).exists()  # its message has arrived
    assert deliveries_dispatch_due() == [delivery_id]
    assert not DeliveryLease.objects.exists()
    assert DeliveryOutbox.objects.get(delivery_id=delivery_id).published_at is not None
    assert deliveries_dispatch_due() == []  # published once, not on every run


def test_a_worker_reports_how_far_it_has_consumed_each_queue(api, receiver, processes):
    create_endpoint(api, receiver.url())
    processes(celery_worker("marks"))
    ids = _deliveries(api, 3)
    wait_until(lambda: all_succeeded(ids))
    newest = max(Delivery.objects.filter(pk__in=ids).values_list("created_at", flat=True))
    # the mark of the last message consumed reaches PostgreSQL within a second
    wait_until(lambda: progress.consumed_marks().get(MAIN, newest - timedelta(1)) >= newest, timeout=5,
               message="the worker's mark reached PostgreSQL")


class _Counter:
    def __init__(self):
        self.relayed = 0

    def __call__(self, execute, sql, params, many, context):
        if sql == TAKE_SQL:
            self.relayed += 1
        return execute(sql, params, many, context)
