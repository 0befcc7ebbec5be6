"""The relay: sends committed outbox rows to Herald, in order per tenant, each one Herald event exactly once.

How a row can never become two events, whatever moment a relay dies at:

- Rows are sent in batches (`POST …/events/batch`, one request for up to `batch_size` rows of one
  tenant, 500 by default, and at most `max_batch_bytes` of events, under half Herald's default body limit). A batch's membership is written to its rows (`batch`, a UUID) and committed *before* the POST,
  and never changes afterwards; its Idempotency-Key is made from that UUID. A relay that dies before,
  during or after the POST leaves rows that name their batch, and the next relay sends exactly that batch
  again, with the same body and the same key: Herald answers with the stored result (a replay), never
  with new events. (A key derived from whichever rows a relay happens to pick would not do: after a
  crash the next relay could pick other rows, and the same row would travel under two keys.)
- A batch that Herald refuses as a whole (400 `validation_error`, 413) stored nothing, so its rows are
  then sent one by one, each under its own key (`key`, a UUID written by `publish`): the good ones go
  through, the bad ones fail alone.
- Rows are marked sent in the same transaction that held them while the POST ran.

Order per tenant: a relay takes the oldest pending rows (by id: a row written after another committed
transaction's row always has the higher id), and sends a tenant's batches one after the other, never a
later one while an earlier one is unsent. Several relays at once: on PostgreSQL and MySQL/MariaDB the
rows being sent are locked (`SELECT … FOR UPDATE SKIP LOCKED`), locks that die with a killed relay's
connection; a relay that finds a tenant's earlier rows held by another leaves that tenant alone this
round. SQLite has no row locks (and a single writer): two relays there may send the same batch, under
the same key, and Herald makes one event of it.
"""
from __future__ import annotations

import json
import logging
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import quote

from django.db import DatabaseError, connections, router, transaction
from django.db.models import Case, Value, When
from django.utils import timezone

from herald_client import NO_RETRIES, APIError, Herald, HeraldConnectionError
from herald_client.django import conf
from herald_client.django.models import OutboxMessage

logger = logging.getLogger("herald_client.django")

SENT_RETENTION = timedelta(days=1)
IN_PROGRESS = "idempotency_key_in_progress"
KEY_PREFIX = "herald-outbox-"


@dataclass
class Batch:
    """Rows of one tenant sent in one request: a batch (`batch` set) or one row alone (`batch` None)."""

    tenant: str
    batch: uuid.UUID | None
    first_id: int
    row_id: int | None = None  # the row, when sent alone


@dataclass
class Outcome:
    sent: int = 0
    failed: int = 0
    replayed: int = 0  # of `sent`: rows Herald already had (an earlier relay died after its POST)
    transient: bool = False  # Herald could not take it now: back off, keep the tenant's order
    held: bool = False  # another relay holds these rows (or earlier ones of the tenant)
    retry_after: float | None = None
    reason: str = ""


@dataclass
class Round:
    """What one round did."""

    sent: int = 0
    failed: int = 0
    replayed: int = 0  # of `sent`: rows whose request Herald answered from its stored answer
    batches: int = 0
    transient: bool = False
    held: bool = False
    retry_after: float | None = None
    reasons: list[str] = field(default_factory=list)

    @property
    def progressed(self) -> bool:
        return bool(self.sent or self.failed)


class _Raced(Exception):
    """Another relay changed the rows this one was claiming: try again."""


class Relay:
    """Sends the outbox of one database to one Herald. `client` defaults to `HERALD_API_URL` with
    `HERALD_TOKEN`; `using` to the database the router picks for the outbox."""

    def __init__(self, *, client: Herald | None = None, using: str | None = None, batch_size: int = 500,
                 claim_size: int = 1000, max_batch_bytes: int = 120_000, max_backoff: float = 30.0) -> None:
        if not 1 <= batch_size <= 500:
            raise ValueError("batch_size is 1 to 500 (Herald's batch intake takes up to 500 events)")
        self.client = client or Herald(conf.api_url(), conf.token(), retry=NO_RETRIES, timeout=(5.0, 60.0))
        self.using = using or router.db_for_write(OutboxMessage)
        self.batch_size = batch_size
        self.claim_size = max(claim_size, batch_size)
        self.max_batch_bytes = max_batch_bytes
        self.max_backoff = max_backoff
        self.failures = 0  # transient failures in a row
        self._pruned_at = 0.0

    @property
    def _locks(self) -> bool:
        return bool(connections[self.using].features.has_select_for_update_skip_locked)

    def _rows(self) -> Any:
        return OutboxMessage.objects.using(self.using)

    # --- one round -------------------------------------------------------------------------------------

    def run_round(self) -> Round:
        """Claim the oldest pending rows and send them, batch after batch; a tenant whose batch could not be
        sent now (Herald unavailable, rows held by another relay) gets nothing more this round."""
        result = Round()
        try:
            batches = self._claim()
        except _Raced:
            result.held = True
            return result
        stopped: set[str] = set()
        for batch in batches:
            if batch.tenant in stopped:
                continue
            outcome = self._send(batch)
            result.batches += 1
            result.sent += outcome.sent
            result.failed += outcome.failed
            result.replayed += outcome.replayed
            if outcome.transient or outcome.held:
                stopped.add(batch.tenant)
                result.transient |= outcome.transient
                result.held |= outcome.held
                if outcome.retry_after is not None:
                    result.retry_after = max(result.retry_after or 0.0, outcome.retry_after)
                if outcome.reason:
                    result.reasons.append(outcome.reason)
        return result

    def _claim(self) -> list[Batch]:
        """The batches to send now, in the order of their first rows; new batches' membership committed."""
        with transaction.atomic(using=self.using):
            pending = self._rows().filter(status=OutboxMessage.PENDING).order_by("id")
            if self._locks:
                pending = pending.select_for_update(skip_locked=True)
            rows = list(pending.only("id", "tenant", "batch", "single", "type", "data", "channels")[:self.claim_size])
            if not rows:
                return []
            # Pending rows up to the last one claimed that this relay did not get are held by another relay
            # (locked); a tenant is sent only up to its first such row, so its order holds.
            mine = [row.id for row in rows]
            held: dict[str, int] = {}
            for tenant, row_id in (self._rows().filter(status=OutboxMessage.PENDING, id__lte=mine[-1],
                                                       tenant__in={row.tenant for row in rows})
                                   .exclude(id__in=mine).values_list("tenant", "id")):
                held[tenant] = min(held.get(tenant, row_id), row_id)
            by_tenant: dict[str, list[OutboxMessage]] = {}
            for row in rows:
                if row.id < held.get(row.tenant, row.id + 1):
                    by_tenant.setdefault(row.tenant, []).append(row)
            batches: list[Batch] = []
            for tenant, tenant_rows in by_tenant.items():
                if any(row.batch is not None or row.single for row in tenant_rows):
                    batches.extend(self._formed(tenant, tenant_rows))
                else:
                    batches.extend(self._form(tenant, tenant_rows))
        batches.sort(key=lambda batch: batch.first_id)
        return batches

    @staticmethod
    def _formed(tenant: str, rows: list[OutboxMessage]) -> list[Batch]:
        """A tenant whose oldest rows were put in batches (or set to go alone) by an earlier round: those, as
        they are, and no new batch for it this round (the next round forms them, after these)."""
        batches: list[Batch] = []
        seen: set[uuid.UUID] = set()
        for row in rows:
            if row.single:
                batches.append(Batch(tenant, None, row.id, row_id=row.id))
            elif row.batch is not None:
                if row.batch not in seen:
                    seen.add(row.batch)
                    batches.append(Batch(tenant, row.batch, row.id))
            else:
                break
        return batches

    def _form(self, tenant: str, rows: list[OutboxMessage]) -> list[Batch]:
        """New batches of a tenant's oldest rows, at most `batch_size` rows and `max_batch_bytes` each;
        their membership is written now (committed with the claim, before any POST)."""
        groups: list[list[OutboxMessage]] = [[]]
        size = 0
        for row in rows:
            row_bytes = len(json.dumps(_event(row), separators=(",", ":"), ensure_ascii=False).encode())
            if groups[-1] and (len(groups[-1]) >= self.batch_size or size + row_bytes > self.max_batch_bytes):
                groups.append([])
                size = 0
            groups[-1].append(row)
            size += row_bytes
        batches = []
        for group in groups:
            batch_id = uuid.uuid4()
            ids = [row.id for row in group]
            changed = self._rows().filter(id__in=ids, batch__isnull=True, single=False,
                                          status=OutboxMessage.PENDING).update(batch=batch_id)
            if changed != len(ids):  # SQLite: another relay formed a batch of them first
                raise _Raced()
            batches.append(Batch(tenant, batch_id, ids[0]))
        return batches

    def _send(self, batch: Batch) -> Outcome:
        """POST one batch (or one row) and record Herald's answer. With row locks, the rows stay locked from
        before the POST until their new state commits; a transient failure rolls back and changes nothing."""
        if self._locks:
            try:
                with transaction.atomic(using=self.using):
                    members = self._members(batch)
                    rows = list(members.select_for_update(skip_locked=True))
                    if len(rows) != members.count():
                        return Outcome(held=True)
                    outcome = self._post_and_record(batch, rows)
                    if outcome.transient:
                        transaction.set_rollback(True, using=self.using)
                    return outcome
            except DatabaseError as exc:  # e.g. the row locks could not be kept: the rows stay pending
                return Outcome(transient=True, reason=f"database: {exc}")
        rows = list(self._members(batch))
        return self._post_and_record(batch, rows)

    def _members(self, batch: Batch) -> Any:
        pending = self._rows().filter(status=OutboxMessage.PENDING).order_by("id")
        if batch.row_id is not None:
            return pending.filter(id=batch.row_id)
        return pending.filter(batch=batch.batch, single=False)

    def _post_and_record(self, batch: Batch, rows: list[OutboxMessage]) -> Outcome:
        if not rows:  # sent (or refused) by another relay meanwhile
            return Outcome()
        prefix = f"tenants/{quote(batch.tenant, safe='')}/" if batch.tenant else ""
        if batch.row_id is not None:
            path, body, key = prefix + "events", _event(rows[0]), f"{KEY_PREFIX}{rows[0].key}"
        else:
            path, body = prefix + "events/batch", {"events": [_event(row) for row in rows]}
            key = f"{KEY_PREFIX}batch-{batch.batch}"
        try:
            answer = self.client.request("POST", path, json=body, idempotency_key=key, retry=NO_RETRIES)
        except HeraldConnectionError as exc:
            return Outcome(transient=True, reason=f"no answer from Herald: {exc.__cause__ or exc}")
        except APIError as exc:
            if exc.status >= 500 or exc.status in (408, 429) or (exc.status == 409 and exc.code == IN_PROGRESS):
                return Outcome(transient=True, retry_after=exc.retry_after, reason=f"{exc.status} {exc.code or ''}")
            if batch.row_id is None and len(rows) > 1 and (
                    exc.status == 413 or (exc.status == 400 and exc.code == "validation_error")):
                # Refused as a whole, so nothing of it was stored: each row goes alone, under its own key.
                self._rows().filter(id__in=[row.id for row in rows]).update(single=True)
                logger.warning("herald outbox: batch %s (rows %d-%d) refused as a whole (%s); sending its rows "
                               "one by one", batch.batch, rows[0].id, rows[-1].id, exc)
                return Outcome(held=True)  # the tenant's next rows wait for these
            problem: dict[str, Any] = {"status": exc.status, "code": exc.code, "title": exc.title, "detail": exc.detail}
            if exc.errors:
                problem["errors"] = exc.errors
            self._rows().filter(id__in=[row.id for row in rows]).update(status=OutboxMessage.FAILED, error=problem)
            logger.error("herald outbox: Herald refused rows %s for good: %s", [row.id for row in rows], exc)
            return Outcome(failed=len(rows))
        answered = answer.json()
        events = [answered] if batch.row_id is not None else answered["data"]
        # One UPDATE: the same status and time for all, each row's event id by a CASE on its id.
        event_ids = Case(*(When(id=row.id, then=Value(event["id"])) for row, event in zip(rows, events)),
                         output_field=OutboxMessage._meta.get_field("event_id"))
        self._rows().filter(id__in=[row.id for row in rows]).update(
            status=OutboxMessage.SENT, sent_at=timezone.now(), event_id=event_ids)
        return Outcome(sent=len(rows), replayed=len(rows) if answer.replayed else 0)

    # --- loops -----------------------------------------------------------------------------------------

    def backoff(self, round_: Round) -> float:
        """Seconds to wait after a round that met a transient failure: Herald's `Retry-After` when it sent
        one, else a capped exponential back-off with jitter."""
        self.failures += 1
        if round_.retry_after is not None:
            return float(min(round_.retry_after, self.max_backoff))
        return float(min(self.max_backoff, 0.25 * 2 ** (self.failures - 1)) * random.uniform(0.5, 1.0))

    def step(self, sleep: Callable[[float], None] = time.sleep, interval: float = 0.5) -> Round:
        """One round, then the wait before the next: a back-off after a transient failure, `interval` when
        there was nothing to send. Database errors are a transient failure too (the connection is reset)."""
        try:
            result = self.run_round()
        except DatabaseError as exc:
            connections[self.using].close()
            result = Round(transient=True, reasons=[f"database: {exc}"])
        if result.transient:
            delay = self.backoff(result)
            logger.warning("herald outbox: %s; retrying in %.2f s", "; ".join(result.reasons) or "unavailable", delay)
            sleep(delay)
        else:
            self.failures = 0
            self.prune_now_and_then()
            if result.held:  # another relay has the tenant's oldest rows, or raced this one to them
                sleep(0.05)
            elif not result.progressed:
                sleep(interval)
        return result

    def run(self, *, stop: Callable[[], bool] = lambda: False, interval: float = 0.5,
            on_round: Callable[[Round], None] | None = None) -> None:
        """Send rows until `stop()` is true."""
        while not stop():
            result = self.step(interval=interval)
            if on_round is not None:
                on_round(result)

    def drain(self, *, max_seconds: float = 60.0, on_round: Callable[[Round], None] | None = None) -> Round:
        """Send what is there and return (`--once`, the Celery task): rounds until one finds nothing to send,
        backing off on transient failures for at most `max_seconds` in all. The total of every round."""
        total = Round()
        deadline = time.monotonic() + max_seconds
        while time.monotonic() < deadline:
            result = self.step(sleep=lambda s: time.sleep(max(0.0, min(s, deadline - time.monotonic()))),
                               interval=0.0)
            if on_round is not None:
                on_round(result)
            total.sent += result.sent
            total.failed += result.failed
            total.replayed += result.replayed
            total.batches += result.batches
            total.transient = result.transient
            total.reasons = result.reasons
            if not result.progressed and not result.transient and not result.held:
                break
        self.prune()
        return total

    def prune_now_and_then(self, every: float = 60.0) -> None:
        if time.monotonic() - self._pruned_at >= every:
            self.prune()

    def prune(self, chunk: int = 1000) -> int:
        """Delete rows sent more than a day ago, `chunk` at a time; how many went."""
        self._pruned_at = time.monotonic()
        cutoff = timezone.now() - SENT_RETENTION
        pruned = 0
        while True:
            ids = list(self._rows().filter(status=OutboxMessage.SENT, sent_at__lt=cutoff)
                       .order_by("id").values_list("id", flat=True)[:chunk])
            if not ids:
                return pruned
            pruned += int(self._rows().filter(id__in=ids).delete()[0])
            if len(ids) < chunk:
                return pruned


def _event(row: OutboxMessage) -> dict[str, Any]:
    """The row as Herald's intake takes one event: the same body every time the row is sent."""
    body: dict[str, Any] = {"type": row.type, "data": row.data}
    if row.channels:
        body["channels"] = row.channels
    return body
