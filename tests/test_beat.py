"""Two `celery -A config beat` processes at once, as on two hosts: one ticks, the other takes over when
it dies (SIGKILL: no goodbye), within 2 x WEBHOOK_DISPATCH_INTERVAL_SECONDS + 10 s."""
import signal
import time

import pytest
from django.conf import settings

from tests.conftest import wait_until
from tests.processes import celery_beat

pytestmark = pytest.mark.django_db(transaction=True)

SENT = "Sending due task dispatch-due-deliveries"


def _sends(beat) -> int:
    return beat.output().count(SENT)


def test_two_beats_tick_one_at_a_time_and_the_second_takes_over_when_the_first_dies(processes):
    first = processes(celery_beat())
    wait_until(lambda: _sends(first) > 0, timeout=15, message="the first beat to tick")
    second = processes(celery_beat())
    time.sleep(3)  # six dispatcher intervals side by side
    before = _sends(first), _sends(second)
    time.sleep(3)
    assert _sends(first) > before[0] + 3, "the leading beat stopped ticking"
    assert _sends(second) == 0, "the standby beat sent periodic tasks too"

    first.popen.send_signal(signal.SIGKILL)  # its process group's leader: the beat itself
    killed = time.monotonic()
    wait_until(lambda: _sends(second) > 0, timeout=30, message="the standby beat to take over")
    failover = time.monotonic() - killed
    assert failover <= 2 * settings.WEBHOOK_DISPATCH_INTERVAL_SECONDS + 10, failover
    time.sleep(2)
    assert _sends(second) >= 2  # and it keeps ticking
    print(f"beat failover: the standby ticked {failover:.1f} s after the leader was killed")
