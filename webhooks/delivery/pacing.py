"""A worker's engine's clocks for throttled endpoints (webhooks/delivery/engine.py; engine thread only):
when each may start its next attempt, so that its parked deliveries are handed on then (`WakeUps`), and its
attempts' starts kept its interval apart, however long each waited between its claim and its start (`Pacing`).
"""
from __future__ import annotations

import heapq
from datetime import datetime, timedelta

from webhooks import tracing
from webhooks.delivery.claim import Claim


class WakeUps:
    """When throttled endpoints may start their next attempt, as the claims reported it (engine thread only).

    Every distinct time a claim reports for an endpoint gets a wake-up of its own. Keeping only the earliest
    one would lose the endpoint: a record can hand a parked delivery on (the throttle allowed it by then)
    while an earlier wake-up is still pending; that delivery's claim moves the throttle on and reports the
    later time, the earlier wake-up then finds no room, and nobody is left to hand the rest on (only beat's
    safety net, much later). A wake-up that finds no room costs one query; the same time reported twice
    (each parked claim reports the endpoint's current one) is kept once.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, str, datetime]] = []  # (time.monotonic(), endpoint id, reported time)
        self._pending: set[tuple[str, datetime]] = set()

    def add(self, endpoint_id: str, when: datetime, at: float) -> None:
        """A claim said `endpoint_id` may start an attempt at `when` (database time): `at` on this clock."""
        if (endpoint_id, when) not in self._pending:
            self._pending.add((endpoint_id, when))
            heapq.heappush(self._heap, (at, endpoint_id, when))

    def next_at(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def due(self, now: float) -> list[str]:
        """The endpoints with a wake-up due by `now` (each once), and those wake-ups forgotten."""
        endpoints: dict[str, None] = {}
        while self._heap and self._heap[0][0] <= now:
            _, endpoint_id, when = heapq.heappop(self._heap)
            self._pending.discard((endpoint_id, when))
            endpoints[endpoint_id] = None
        return list(endpoints)


class Pacing:
    """The starts of throttled endpoints' attempts on this engine, kept their throttle's interval apart at least
    (engine thread only).

    A claim moves its endpoint's throttle on by the interval (1 / throttle_rate) from the claim's own time, and
    the next claim waits for that; but an attempt starts a little after its claim (the claimer thread's or a
    record's transaction, then the engine's next turn), and not always the same little: two claims an interval
    apart could start closer than that, and a receiver would see more than throttle_rate attempts in a second.
    An attempt whose endpoint started one here less than an interval ago waits for the rest of it. The interval
    is read off the claim: its throttle time less its claim time (its lease's end less the lease).
    """

    def __init__(self) -> None:
        self._last: dict[str, float] = {}  # endpoint id -> its latest start here (time.monotonic()), kept a second
        self._heap: list[tuple[float, int, tuple[Claim, tracing.DeliveryTrace | None]]] = []
        self._seq = 0

    @property
    def waiting(self) -> bool:
        return bool(self._heap)

    def start_now(self, item: tuple[Claim, tracing.DeliveryTrace | None], interval: timedelta, now: float) -> bool:
        """True if the claim may start now; else it is kept until it may (`due`)."""
        endpoint_id = item[0].endpoint_id
        last = self._last.get(endpoint_id)
        at = now if last is None else max(now, last + min(max(interval.total_seconds(), 0.0), 1.0))
        self._last[endpoint_id] = at
        if len(self._last) > 1000:  # an interval is at most a second: older starts hold nothing back
            self._last = {e: t for e, t in self._last.items() if t > now - 1.0}
        if at <= now:
            return True
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, item))
        return False

    def next_at(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def due(self, now: float) -> list[tuple[Claim, tracing.DeliveryTrace | None]]:
        items = []
        while self._heap and self._heap[0][0] <= now:
            items.append(heapq.heappop(self._heap)[2])
        return items
