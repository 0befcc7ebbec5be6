"""Which due outbox rows a relay publishes next: weighted fair shares across tenants (SPEC §10).

The backlog stays in PostgreSQL, where the choice can be fair; only a bounded number of ids is published
and not yet claimed at any moment (WEBHOOK_PUBLISH_WINDOW, across every relay), so the broker's first-in,
first-out queues stay short and a quiet tenant's delivery, once chosen, has little ahead of it.

Each pass of a relay (or of beat's dispatcher, which runs the same step):
1. counts what is published and unclaimed (outbox.WINDOW_SQL): the room is the window minus that, at most
   the batch;
2. walks the tenants that have due, unpublished rows, in id order from where its last pass stopped,
   wrapping round (outbox.READY_SQL: one index probe per tenant, at most `room` tenants);
3. gives the room out in rounds, deficit round robin: `delivery_weight` rows to each tenant a round, whole
   rounds while the room holds them, then a last round cut short where the room ends. The tenant cut short
   is owed the rest and goes first next pass. A round is the same size whatever the room, so the shares
   hold when claims free room a few ids at a time. A tenant that has fewer rows than its share leaves the
   rest (work-conserving: the relay passes again at once, and the others take it);
4. takes them (outbox.TAKE_SQL) and returns them interleaved by their place in the round (a row's rank in
   its tenant ÷ its weight), so that a message of a hundred ids carries every tenant's first rows first.

A tenant alone takes the whole room; two with backlogs and weights 1 and 3 take a quarter and three
quarters of every pass; a tenant that posts one event while another has a backlog of 20,000 is in the next
pass, at most a window's worth of ids behind in the broker. Retries (a record's outbox row), manual retries
and recoveries, and operational events all come through the outbox, so they are chosen the same way.

The scheduler's state (where the walk resumes, the credit of a tenant cut short) lives in the relay's
memory: each relay (one per worker, and the dispatcher) rotates on its own; losing it costs one pass's
order, nothing else.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from django.db import connection

from webhooks.delivery import outbox


@dataclass
class Pass:
    """What one pass took: (delivery id, for the retry queue?, published_at, tenant id) rows, in publishing
    order; `more`: some tenant may have due rows still (it took all it was given, or the walk stopped)."""

    rows: list[tuple] = field(default_factory=list)
    more: bool = False


class Scheduler:
    """The rotation of one relay (see the module doc). Thread-safe: a pass holds its lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._start = ""  # the walk resumes at the first tenant id >= this
        self._skip_start = False  # ... and past it, unless it was cut short
        self._credit: tuple[str, int] | None = None  # (tenant, rows) owed from a pass that cut it short
        self.backlog = False  # the last pass left due rows unpublished (for want of room, or of a pass)

    @staticmethod
    def room(*, window: int) -> int:
        """How many more ids may be published now: the window less what is published and unclaimed."""
        with connection.cursor() as cursor:
            cursor.execute(outbox.WINDOW_SQL)
            (published,) = cursor.fetchone()
        return max(0, window - published)

    def take(self, room: int) -> Pass:
        """Choose and mark published up to `room` due rows (see the module doc); in the caller's transaction."""
        with self._lock:
            chosen = self._take(room)
            self.backlog = chosen.more
        return chosen

    def _take(self, room: int) -> Pass:
        if room <= 0:
            with connection.cursor() as cursor:
                cursor.execute(outbox.ANY_DUE_SQL)
                return Pass(more=cursor.fetchone() is not None)
        ready = self._walk(room)
        if not ready:
            self._start, self._skip_start, self._credit = "", False, None
            return Pass()
        shares = self._shares(ready, room)
        with connection.cursor() as cursor:
            cursor.execute(outbox.TAKE_SQL, {"tenants": [t for t, _ in shares], "takes": [n for _, n in shares]})
            rows = cursor.fetchall()
        return Pass(rows=_interleave(rows, dict(ready)), more=len(ready) >= room or _some_took_all(rows, shares))

    def _walk(self, limit: int) -> list[tuple[str, int]]:
        """Up to `limit` ready tenants (id, weight) in ring order from where the last pass stopped."""
        def walk(start: str, tenants: int) -> list[tuple[str, int]]:
            with connection.cursor() as cursor:
                cursor.execute(outbox.READY_SQL, {"start": start, "tenants": tenants})
                return cursor.fetchall()

        ready = walk(self._start, limit + 1)
        if self._skip_start and ready and ready[0][0] == self._start:
            ready = ready[1:]
        ready = ready[:limit]
        if len(ready) < limit and self._start:
            seen = {t for t, _ in ready}
            for tenant, weight in walk("", limit - len(ready)):
                if tenant in seen:
                    break
                ready.append((tenant, weight))
        return ready

    def _shares(self, ready: list[tuple[str, int]], room: int) -> list[tuple[str, int]]:
        """Give the room out in rounds over the ready tenants, ring order, `weight` rows each a round (the
        first may be owed the rest of its last quantum); moves the rotation on. A round is the same for every
        tenant whatever the room, so that over passes each gets its weight's share."""
        shares: dict[str, int] = {}
        left = room
        ring = ready
        credit, self._credit = self._credit, None
        if credit is not None and ready[0][0] == credit[0]:
            give = min(credit[1], left)
            shares[credit[0]] = give
            left -= give
            self._start, self._skip_start = credit[0], True
            if give < credit[1]:
                self._credit, self._skip_start = (credit[0], credit[1] - give), False
                return list(shares.items())
            ring = ready[1:] + ready[:1]
        total = sum(weight for _, weight in ring)
        rounds = left // total  # whole rounds: everyone its weight each
        if rounds:
            for tenant, weight in ring:
                shares[tenant] = shares.get(tenant, 0) + weight * rounds
            left -= total * rounds
            self._start, self._skip_start = ring[-1][0], True
        for tenant, weight in ring:  # a last round, cut short where the room ends
            if left == 0:
                break
            give = min(weight, left)
            shares[tenant] = shares.get(tenant, 0) + give
            left -= give
            self._start, self._skip_start = tenant, True
            if give < weight:
                self._credit, self._skip_start = (tenant, weight - give), False
        return list(shares.items())


def _some_took_all(rows: list[tuple], shares: list[tuple[str, int]]) -> bool:
    taken: dict[str, int] = {}
    for row in rows:
        taken[row[3]] = taken.get(row[3], 0) + 1
    return any(taken.get(tenant, 0) >= n for tenant, n in shares)


def _interleave(rows: list[tuple], weights: dict[str, int]) -> list[tuple]:
    """The rows in the order of their place in the round: the k-th row of a tenant of weight w at k / w."""
    rank: dict[str, int] = {}
    keyed = []
    for row in sorted(rows, key=lambda row: row[0]):  # a tenant's rows in id (time) order
        rank[row[3]] = rank.get(row[3], 0) + 1
        keyed.append((rank[row[3]] / weights.get(row[3], 1), row))
    return [row for _, row in sorted(keyed, key=lambda pair: pair[0])]
