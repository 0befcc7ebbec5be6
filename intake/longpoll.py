"""What a long-poll view and gunicorn's worker say to each other (config/gunicorn_worker.py).

A view that has nothing to answer yet calls `park(key, deadline)` on the `LongPoll` it finds in the
WSGI environ under ENVIRON_KEY, and returns any response (it is thrown away). The worker then keeps the
connection in its event loop, holding no thread, until a NOTIFY names `key` on POLL_CHANNEL or the
deadline passes, and runs the same request again, with `deadline` set: the view answers with what it
finds then (or parks again until the same deadline). Without the key in the environ (another server, a
TLS connection the worker does not buffer) the view waits on its own thread, bounded.

A wait holds a place under POLL_MAX_WAITS_* (intake/waits.py) from the view's first park until the
request is answered or its client hangs up: `wait` carries it from run to run, and whoever ends the
request (ParkingApp in config/gunicorn_worker.py, or the worker when the client is gone) releases it.
"""
import time

from prometheus_client.core import GaugeMetricFamily

ENVIRON_KEY = "herald.longpoll"

# The worker of this process that parks long-polls (config/gunicorn_worker.py), once it runs: /metrics tells
# how many requests it holds parked and whether its listener is connected (tests wait on these rather than
# sleep; an operator sees parked polls pile up).
_worker = None


class LongPoll:
    """One request's long-poll state: `deadline` (time.monotonic()) is set when this is a run after a wait."""

    __slots__ = ("deadline", "parked_on", "since", "wait", "refused")

    def __init__(self, deadline: float | None = None, wait=None):
        self.deadline = deadline
        self.parked_on: str | None = None
        self.since = 0.0
        self.wait = wait   # intake.waits.Wait, once the view took a place for this long-poll
        self.refused = False   # answered 429 too_many_waits: the worker closes the connection after it

    def park(self, *, key: str, deadline: float, since: float) -> None:
        """Wait for a NOTIFY of `key` after `since` (the monotonic time before the view looked), or `deadline`."""
        self.parked_on = key
        self.deadline = deadline
        self.since = since


def now() -> float:
    return time.monotonic()


def worker_started(worker) -> None:
    global _worker
    _worker = worker


class LongPollCollector:
    """This process's parked long-polls and listener, for /metrics (nothing where no worker parks them)."""

    def collect(self):
        worker = _worker
        if worker is None:
            return
        yield GaugeMetricFamily("herald_long_polls_parked",
                                "Long-polls this gunicorn worker holds parked (no thread), waiting for a message",
                                value=len(worker.waiting))
        yield GaugeMetricFamily("herald_long_poll_listener_up",
                                "1 while this gunicorn worker's LISTEN connection for long-polls is connected",
                                value=0 if worker.listener is None else 1)
