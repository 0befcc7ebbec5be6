"""What a long-poll view and gunicorn's worker say to each other (config/gunicorn_worker.py).

A view that has nothing to answer yet calls `park(key, deadline)` on the `LongPoll` it finds in the
WSGI environ under ENVIRON_KEY, and returns any response (it is thrown away). The worker then keeps the
connection in its event loop, holding no thread, until a NOTIFY names `key` on POLL_CHANNEL or the
deadline passes, and runs the same request again, with `deadline` set: the view answers with what it
finds then (or parks again until the same deadline). Without the key in the environ (another server, a
TLS connection the worker does not buffer) the view waits on its own thread, bounded.
"""
import time

ENVIRON_KEY = "herald.longpoll"


class LongPoll:
    """One request's long-poll state: `deadline` (time.monotonic()) is set when this is a run after a wait."""

    __slots__ = ("deadline", "parked_on", "since")

    def __init__(self, deadline: float | None = None):
        self.deadline = deadline
        self.parked_on: str | None = None
        self.since = 0.0

    def park(self, *, key: str, deadline: float, since: float) -> None:
        """Wait for a NOTIFY of `key` after `since` (the monotonic time before the view looked), or `deadline`."""
        self.parked_on = key
        self.deadline = deadline
        self.since = since


def now() -> float:
    return time.monotonic()
