"""Several hosts: two `celery -A config beat` processes at once (one ticks, the other takes over when it
dies: SIGKILL, no goodbye, within 2 x WEBHOOK_DISPATCH_INTERVAL_SECONDS + 10 s), and three workers
with their own host names, of which one dies mid-run."""
import signal
import time

import pytest
from django.conf import settings

from tests.conftest import all_succeeded, create_endpoint, wait_until
from tests.processes import celery_beat, celery_worker
from tests.receiver import Answer
from webhooks.models import Delivery

pytestmark = pytest.mark.django_db(transaction=True)

SENT = "Sending due task dispatch-due-deliveries"  # logged at DEBUG (config/logs.py): beats run with DEBUG here
# celery.beat logs this at DEBUG after each tick() returns: for a standby, after each failed try for the lock
WOKE = "beat: Waking up"


def _sends(beat) -> int:
    return beat.output().count(SENT)


def _wakes(beat) -> int:
    return beat.output().count(WOKE)


def test_two_beats_tick_one_at_a_time_and_the_second_takes_over_when_the_first_dies(processes):
    first = processes(celery_beat("DEBUG"))
    wait_until(lambda: _sends(first) > 0, timeout=15, message="the first beat to tick")
    second = processes(celery_beat("DEBUG"))
    # side by side: the standby tried for the lock (and woke up again) several times, while the leader kept
    # sending; a standby that ticked would have sent by then (its first try comes before its first wake-up)
    before = _sends(first)
    wait_until(lambda: _wakes(second) >= 4 and _sends(first) >= before + 4, timeout=30,
               message="the standby to try for the lock four times while the leader ticks")
    assert _sends(second) == 0, "the standby beat sent periodic tasks too"

    first.popen.send_signal(signal.SIGKILL)  # its process group's leader: the beat itself
    killed = time.monotonic()
    wait_until(lambda: _sends(second) > 0, timeout=30, message="the standby beat to take over")
    failover = time.monotonic() - killed
    assert failover <= 2 * settings.WEBHOOK_DISPATCH_INTERVAL_SECONDS + 10, failover
    wait_until(lambda: _sends(second) >= 3, timeout=30, message="the new leader to keep ticking")
    print(f"beat failover: the standby ticked {failover:.1f} s after the leader was killed")


def test_three_workers_and_two_beats_lose_nothing_when_the_ticking_beat_and_a_worker_die(api, receiver, processes):
    create_endpoint(api, receiver.url("/hook"), max_in_flight=100)
    beats = [processes(celery_beat("DEBUG")), processes(celery_beat("DEBUG"))]
    wait_until(lambda: any(_sends(beat) for beat in beats), timeout=15, message="a beat to tick")
    workers = [processes(celery_worker(f"host{n}", concurrency=20)) for n in range(3)]
    receiver.script("/hook", *[Answer(delay=0.5)] * 90)  # every attempt in flight for half a second
    ids = [d["id"] for n in range(90)
           for d in api.send_event("invoice.paid", {"n": n})["deliveries"]]
    receiver.wait_for(10, timeout=20)

    # mid-run: the ticking beat and one worker die without a goodbye
    (leader,) = [beat for beat in beats if _sends(beat)]
    leader.popen.send_signal(signal.SIGKILL)
    workers[0].kill()

    wait_until(lambda: all_succeeded(ids), timeout=60, message="every delivery after the deaths")
    (survivor,) = [beat for beat in beats if beat is not leader]
    wait_until(lambda: _sends(survivor) > 0, timeout=15, message="the surviving beat to tick")
    received = receiver.requests_to("/hook")
    event_ids = set(Delivery.objects.filter(pk__in=ids).values_list("event_id", flat=True))
    assert {r.headers["webhook-id"] for r in received} == event_ids  # nothing lost
    # a delivery the dead worker had in flight may be sent again, but never twice at the same moment
    assert max(receiver.max_in_flight[event_id] for event_id in event_ids) == 1
    print(f"{len(received)} requests for {len(ids)} deliveries ({len(received) - len(ids)} sent again)")
