"""Verdicts: read-only queries of Herald's database with psycopg, and the pure comparisons the scenarios assert."""
from __future__ import annotations

import hashlib
import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

import psycopg

# ---------------------------------------------------------------- the database, read only


class Db:
    """Read-only access to Herald's tables; survives a PostgreSQL restart by reconnecting (bounded)."""

    def __init__(self, dsn: str):
        self.dsn = dsn
        self._conn: psycopg.Connection | None = None

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn, autocommit=True)
        return self._conn

    def rows(self, sql: str, params=(), retry_for: float = 60.0) -> list[tuple]:
        deadline = time.monotonic() + retry_for
        while True:
            try:
                with self._connection().cursor() as cursor:
                    cursor.execute(sql, params)
                    return cursor.fetchall()
            except psycopg.OperationalError:
                self.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001
                pass
            self._conn = None

    # -- identities

    def credential(self, token: str) -> tuple[int, str]:
        """(credential id, tenant id) of a token, found by its SHA-256 like Herald stores it."""
        digest = hashlib.sha256(token.encode()).hexdigest()
        rows = self.rows("SELECT id, tenant_id FROM intake_apicredential WHERE token_hash = %s", (digest,))
        if not rows:
            raise LookupError("credential not found")
        return rows[0]

    # -- intake

    def events_by_key(self, tenant_id: str) -> dict[str, list[str]]:
        """Event ids per client key (every event the suite posts carries its key in data.key); Herald's own
        operational events (`herald.…`), which no client posted, are left out."""
        out: dict[str, list[str]] = defaultdict(list)
        for key, event_id in self.rows("SELECT convert_from(payload, 'UTF8')::jsonb #>> '{data,key}', id "
                                       "FROM webhooks_event WHERE tenant_id = %s "
                                       "AND type NOT LIKE 'herald.%%' ORDER BY id", (tenant_id,)):
            out[key].append(event_id)
        return dict(out)

    def events_by_request_id(self, request_ids: list[str]) -> dict[str, int]:
        if not request_ids:
            return {}
        return dict(self.rows("SELECT request_id, count(*) FROM webhooks_event WHERE request_id = ANY(%s) "
                              "GROUP BY request_id", (request_ids,)))

    def stored_keys(self, keys: list[str]) -> dict[str, tuple[int, int]]:
        """key -> (credential id, response status) for every stored idempotency key among `keys`. A key holding
        U+0000 cannot be stored (PostgreSQL text refuses it), so it is not looked up: asking would be an error."""
        keys = [key for key in keys if "\x00" not in key]
        if not keys:
            return {}
        return {key: (cred, rstatus) for key, cred, rstatus in self.rows(
            "SELECT key, credential_id, response_status FROM intake_idempotencykey WHERE key = ANY(%s)",
            (keys,))}

    # -- delivery

    def deliveries(self, tenant_id: str) -> dict[str, dict]:
        rows = self.rows(
            "SELECT id, event_id, endpoint_id, status, attempt_count FROM webhooks_delivery WHERE tenant_id = %s",
            (tenant_id,))
        return {r[0]: {"id": r[0], "event_id": r[1], "endpoint_id": r[2], "status": r[3], "attempt_count": r[4]}
                for r in rows}

    def attempts(self, tenant_id: str) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = defaultdict(list)
        for delivery_id, number, status, error, duration in self.rows(
                "SELECT a.delivery_id, a.number, a.response_status, a.error, a.duration_ms "
                "FROM webhooks_deliveryattempt a JOIN webhooks_delivery d ON d.id = a.delivery_id "
                "WHERE d.tenant_id = %s ORDER BY a.delivery_id, a.number", (tenant_id,)):
            out[delivery_id].append({"number": number, "response_status": status, "error": error,
                                     "duration_ms": duration})
        return dict(out)

    def first_attempt_starts(self, tenant_id: str) -> list[tuple[str, float, float]]:
        """(event id, first attempt's start, event's created_at) in epoch seconds for every first attempt of a
        tenant's deliveries, as Herald recorded them (`attempts[0].started_at`)."""
        return self.rows("SELECT d.event_id, extract(epoch FROM a.started_at)::float8, "
                         "extract(epoch FROM e.created_at)::float8 FROM webhooks_deliveryattempt a "
                         "JOIN webhooks_delivery d ON d.id = a.delivery_id JOIN webhooks_event e ON e.id = d.event_id "
                         "WHERE d.tenant_id = %s AND a.number = 1", (tenant_id,))

    def attempt_intervals(self, endpoint_id: str) -> list[tuple[float, float]]:
        """(start, end) in epoch seconds of every recorded attempt to one endpoint, as Herald timed them."""
        return [(start, start + duration / 1000) for start, duration in self.rows(
            "SELECT extract(epoch FROM a.started_at)::float8, a.duration_ms FROM webhooks_deliveryattempt a "
            "JOIN webhooks_delivery d ON d.id = a.delivery_id WHERE d.endpoint_id = %s", (endpoint_id,))]

    def endpoint_health(self, endpoint_id: str) -> dict:
        enabled, tripped_at, failures = self.rows(
            "SELECT enabled, tripped_at IS NOT NULL, consecutive_failures FROM webhooks_endpoint WHERE id = %s",
            (endpoint_id,))[0]
        return {"enabled": enabled, "tripped": tripped_at, "consecutive_failures": failures}

    def status_counts(self, tenant_id: str) -> dict[str, int]:
        return dict(self.rows("SELECT status, count(*) FROM webhooks_delivery WHERE tenant_id = %s GROUP BY status",
                              (tenant_id,)))

    def endpoint_enabled(self, endpoint_id: str) -> bool:
        return bool(self.rows("SELECT enabled FROM webhooks_endpoint WHERE id = %s", (endpoint_id,))[0][0])

    def backlog(self, older_than: float = 10.0) -> int:
        """Pending deliveries that were due more than `older_than` seconds ago (all tenants)."""
        return self.rows("SELECT count(*) FROM webhooks_delivery WHERE status = 'pending' "
                         "AND next_attempt_at < now() - make_interval(secs => %s)", (older_than,))[0][0]


# ---------------------------------------------------------------- pure checks (tests/test_blackbox_harness.py)


def executed_twice(events_by_key: dict[str, list[str]]) -> dict[str, int]:
    """Keys that produced more than one event, with how many extra executions each."""
    return {key: len(ids) - 1 for key, ids in events_by_key.items() if len(ids) > 1}


def missing_keys(expected: set[str], events_by_key: dict[str, list[str]]) -> set[str]:
    """Keys the clients were promised an event for (a 202) that have no event at all."""
    return {key for key in expected if not events_by_key.get(key)}


def key_answer_problems(replies) -> list[str]:
    """Every answer for one key must be its first 202, byte for byte, or a 409 idempotency_key_in_progress.

    `replies` are the replies for that key (anything with status, body, headers, code, replay, sent).
    Only one answer may be the executing one (a 202 without Idempotent-Replay).
    """
    problems = []
    ordered = sorted(replies, key=lambda r: r.sent)
    accepted = [r for r in ordered if r.status == 202]
    if not accepted:
        problems.append("no 202 among " + ", ".join(_describe(r) for r in ordered))
        return problems
    first = accepted[0]
    for reply in ordered:
        if reply.status == 202:
            if reply.body != first.body:
                problems.append("a 202 whose body differs from the first 202")
            if reply.headers.get("location") != first.headers.get("location"):
                problems.append("a 202 whose Location differs from the first 202")
        elif reply.status == 409 and reply.code == "idempotency_key_in_progress":
            continue
        else:
            problems.append(f"unexpected answer {_describe(reply)}")
    originals = [r for r in accepted if not r.replay]
    if len(originals) > 1:
        problems.append(f"{len(originals)} answers without Idempotent-Replay (executed more than once?)")
    return problems


def _describe(reply) -> str:
    if reply.status is None:
        return "no answer"
    code = reply.code
    return f"{reply.status}{' ' + code if code else ''}"


@dataclass(frozen=True)
class Truth:
    """Outcome of comparing one delivery's receiver log with its recorded attempts."""

    problems: tuple[str, ...]
    tolerated: tuple[str, ...] = ()


def attempt_truth(hits, attempts: list[dict], delivery: dict, *, schedule_len: int, timeout: float) -> Truth:
    """Do the attempts in the database say what the receiver did, and does the final status follow from them?

    `hits`: what the receiver saw for this delivery's webhook-id, each with `answered` (status written to a
    still-connected sender, None if the sender gave up first), `arrived`, `finished`, `plan`.
    `attempts`: rows {number, response_status, error} in number order. `delivery`: {status, attempt_count}.
    """
    problems: list[str] = []
    tolerated: list[str] = []
    hits = sorted(hits, key=lambda h: h.arrived)
    attempts = sorted(attempts, key=lambda a: a["number"])
    numbers = [a["number"] for a in attempts]
    if numbers != list(range(1, len(attempts) + 1)):
        problems.append(f"attempt numbers {numbers} are not 1..{len(attempts)}")
    if delivery["attempt_count"] != len(attempts):
        problems.append(f"attempt_count {delivery['attempt_count']} but {len(attempts)} attempts recorded")
    if len(hits) != len(attempts):
        problems.append(f"receiver saw {len(hits)} requests, {len(attempts)} attempts recorded")
    for index, (hit, attempt) in enumerate(zip(hits, attempts), start=1):
        status, error = attempt["response_status"], attempt["error"] or ""
        if hit.answered is None:
            if status is not None or not error.startswith("timeout"):
                problems.append(f"attempt {index}: sender gave up (hang) but recorded status={status} error={error!r}")
        elif status != hit.answered:
            took = (hit.finished or hit.arrived) - hit.arrived
            if status is None and error.startswith("timeout") and took >= timeout - 0.5:
                tolerated.append(f"attempt {index}: answered {hit.answered} after {took:.2f}s, recorded as timeout")
            else:
                problems.append(f"attempt {index}: receiver answered {hit.answered}, recorded status={status} "
                                f"error={error!r}")
        elif 200 <= status < 300 and error:
            problems.append(f"attempt {index}: 2xx recorded with error {error!r}")
    ok = [a for a in attempts if a["response_status"] is not None and 200 <= a["response_status"] < 300
          and not a["error"]]
    status = delivery["status"]
    last = attempts[-1] if attempts else None
    if status == "succeeded":
        if not last or last not in ok:
            problems.append("succeeded, but its last attempt is not a 2xx")
        if len(ok) > 1 or (ok and ok[0] is not last):
            problems.append("an attempt after a 2xx (sent again after success)")
    elif status == "failed":
        if ok:
            problems.append("failed, but an attempt was a 2xx")
        gone = last is not None and last["response_status"] == 410
        if not gone and len(attempts) != schedule_len + 1:
            problems.append(f"failed after {len(attempts)} attempts; the schedule allows {schedule_len + 1}")
    elif status == "pending":
        problems.append("still pending at the end")
    else:
        problems.append(f"unexpected status {status}")
    return Truth(tuple(problems), tuple(tolerated))


def retry_gap_problems(hits, schedule: tuple[int, ...], jitter: float, slack: float = 0.05) -> list[str]:
    """Each retry arrives no earlier than its schedule step × (1 − jitter) after the previous attempt started."""
    hits = sorted(hits, key=lambda h: h.arrived)
    problems = []
    for index in range(1, min(len(hits), len(schedule) + 1)):
        minimum = schedule[index - 1] * (1 - jitter) - slack
        gap = hits[index].arrived - hits[index - 1].arrived
        if gap < minimum:
            problems.append(f"retry {index} came {gap:.2f}s after attempt {index}, before the {minimum:.2f}s minimum")
    return problems


def body_problems(hits_by_id: dict[str, list]) -> list[str]:
    """Every attempt of a webhook carries identical body bytes (SPEC §6)."""
    return [f"{webhook_id}: {len({h.body for h in hits})} different bodies"
            for webhook_id, hits in hits_by_id.items() if len({h.body for h in hits}) > 1]


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one moment (an end and a start at the same instant do not overlap)."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
                   key=lambda edge: (edge[0], edge[1]))
    current = peak = 0
    for _, step in edges:
        current += step
        peak = max(peak, current)
    return peak


def backlog_grew(samples: list[int], floor: int = 5) -> bool:
    """The backlog grows if the last quarter's maximum exceeds both the first quarter's maximum and `floor`."""
    if len(samples) < 4:
        return bool(samples) and samples[-1] > max(floor, samples[0])
    quarter = max(1, len(samples) // 4)
    return max(samples[-quarter:]) > max(max(samples[:quarter]), floor)


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, int(round(pct / 100 * (len(ordered) - 1)))))
    return ordered[index]


def histogram(values) -> str:
    counts = Counter(values)
    return ", ".join(f"{k}×{v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0]))))


def json_safe(value):
    return json.loads(json.dumps(value, default=str))
