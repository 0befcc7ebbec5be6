"""The claim and the record find a delivery by its key, whatever the statistics say.

Beside `id = ...`, a condition `status = 'pending'` lets the planner take the partial index of pending
deliveries (endpoint_id, id) and read all of it for the id. Statistics made while few deliveries were pending
(an ANALYZE after a quiet hour, or after a backlog was cancelled) tell it that index is tiny, and a worker's
session keeps the generic plan it made then: behind a backlog of 20,000 each claim read 370 buffers and took
three times as long (docs/design.md, "How a delivery is chosen"). Here the functions run on such statistics,
behind such a backlog, with every statement they run explained to this session (auto_explain).
"""
import json
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from intake.credentials import credential_create
from tests.conftest import other_session
from webhooks.services.endpoints import endpoint_create

pytestmark = pytest.mark.django_db(transaction=True)

BACKLOG = 3000
DELIVERY_INDEX = re.compile(r"^webhooks_delivery(_p\d+|_default)?_")  # an index of the table or of a partition
BY_ID_ALONE = re.compile(r"^\(\(id\)::text = \(\$\d+\)::text\)$")


def _backlog_that_statistics_do_not_see() -> tuple[list[str], str]:
    """BACKLOG pending deliveries of one endpoint, written cancelled, analyzed so, then made pending: the
    statistics say nothing is pending. Their ids, and the endpoint's."""
    credential, _ = credential_create(tenant_name="plans")
    endpoint = endpoint_create(tenant=credential.tenant, url="http://127.0.0.1:9/plans", event_types=[], channels=[],
                               max_in_flight=1000)
    tenant = credential.tenant_id
    with connection.cursor() as cursor:
        cursor.execute("""
            INSERT INTO webhooks_event (id, tenant_id, type, channels, payload, request_id, created_at)
            SELECT 'evt_plans' || lpad(g::text, 8, '0'), %(tenant)s, 'invoice.paid', '{}', '{}'::bytea, '', now()
              FROM generate_series(1, %(count)s) g""", {"tenant": tenant, "count": BACKLOG})
        cursor.execute("""
            INSERT INTO webhooks_delivery (id, tenant_id, event_id, endpoint_id, status, attempt_count,
                                           next_attempt_at, created_at, updated_at)
            SELECT 'dlv_plans' || lpad(g::text, 8, '0'), %(tenant)s, 'evt_plans' || lpad(g::text, 8, '0'),
                   %(endpoint)s, 'cancelled', 0, now(), now(), now()
              FROM generate_series(1, %(count)s) g""", {"tenant": tenant, "endpoint": endpoint.pk, "count": BACKLOG})
        cursor.execute("ANALYZE webhooks_delivery")
        cursor.execute("UPDATE webhooks_delivery SET status = 'pending' WHERE endpoint_id = %s RETURNING id",
                       [endpoint.pk])
        ids = sorted(row[0] for row in cursor.fetchall())
    return ids, endpoint.pk


def _explained(session) -> list[dict]:
    """Every statement `session` runs from now on, nested ones included, explained to it as JSON."""
    plans: list[dict] = []

    def notice(diagnostic) -> None:
        message = diagnostic.message_primary or ""
        if "plan:" in message:
            plans.append(json.loads(message.split("plan:", 1)[1]))

    session.add_notice_handler(notice)
    for statement in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                      "SET auto_explain.log_nested_statements = on", "SET auto_explain.log_format = json",
                      "SET auto_explain.log_level = notice", "SET client_min_messages = notice"):
        session.execute(statement)
    return plans


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _delivery_lookups_by_id(plans: list[dict]) -> list[tuple[str, str]]:
    """(statement, index) of every index scan of the deliveries (plain, index-only or bitmap) whose only
    condition is the id."""
    found = []
    for explained in plans:
        for node in _nodes(explained["Plan"]):
            if DELIVERY_INDEX.match(node.get("Index Name", "")) and BY_ID_ALONE.match(node.get("Index Cond", "")):
                found.append((" ".join(explained["Query Text"].split())[:100], node["Index Name"]))
    return found


def test_the_claim_and_the_record_find_each_delivery_by_its_key_behind_a_backlog_statistics_do_not_see():
    ids, endpoint = _backlog_that_statistics_do_not_see()
    chosen = ids[BACKLOG // 2:BACKLOG // 2 + 4]
    with other_session() as session:
        # The trap is set: the old claim's condition, planned generically on these statistics, reads the
        # partial index of pending deliveries for the id (if it did not, the test below would prove nothing).
        session.execute("SET plan_cache_mode = force_generic_plan")
        session.execute("PREPARE old_claim(varchar) AS SELECT d.attempt_count FROM webhooks_delivery d "
                        "WHERE d.id = $1 AND d.status = 'pending' AND d.next_attempt_at <= now()")
        old = "\n".join(row[0] for row in session.execute("EXPLAIN EXECUTE old_claim('x')").fetchall())
        assert "Index Cond: ((id)::text = ($1)::text)" in old and "_pkey" not in old, old
        session.execute("RESET plan_cache_mode")

        plans = _explained(session)
        claimed = session.execute("SELECT delivery_id, go, number, lease_end FROM herald_delivery_claim_many(%s, 30, 10)",
                                  [chosen]).fetchall()
        assert [(row[0], row[1]) for row in claimed] == [(i, True) for i in chosen]
        now = timezone.now()
        records = [{"id": delivery, "number": number, "started_at": now.isoformat(), "duration_ms": 5,
                    "response_status": 200 if n % 2 == 0 else 500, "response_body": "", "error": "",
                    "status": "succeeded" if n % 2 == 0 else "pending",
                    "next_attempt_at": None if n % 2 == 0 else (now + timedelta(seconds=60)).isoformat(),
                    "lease_end": lease_end.isoformat(), "endpoint": endpoint, "fast": n % 2 == 0, "hand_on": 10}
                   for n, (delivery, _, number, lease_end) in enumerate(claimed)]
        recorded = session.execute("SELECT delivery_id, applied, moved FROM herald_delivery_record_many(%s, 10)",
                                   [json.dumps(records)]).fetchall()
        assert recorded == [(i, True, True) for i in chosen]

    lookups = _delivery_lookups_by_id(plans)
    statements = {statement for statement, _ in lookups}
    # the claim's reads and the record's update are among them (the check looked at what matters) ...
    assert any("SELECT d.attempt_count" in s for s in statements), statements
    assert any(s.startswith("UPDATE webhooks_delivery d SET status = p_status") for s in statements), statements
    # ... and every one of them went by the key
    assert [(s, index) for s, index in lookups if not index.endswith("_pkey")] == []


def test_a_recoverys_progress_count_finds_its_batch_by_the_keys_behind_a_backlog_statistics_do_not_see():
    """The recovery's count of its batch's waiting deliveries (webhooks/services/recovery.py), as Django runs it
    (its values in the statement: a plan of its own each time), during a recovery, when the pending index is at
    its largest."""
    from webhooks.services import recovery

    ids, _ = _backlog_that_statistics_do_not_see()
    with connection.cursor() as cursor:
        # the trap is set: the count as it was written before, with the rule in its WHERE, reads the pending index
        cursor.execute("EXPLAIN SELECT count(*) FROM webhooks_delivery d WHERE d.id = ANY(%(ids)s) "
                       "AND d.status = 'pending' AND d.next_attempt_at <= %(released_at)s",
                       {"ids": ids[:100], "released_at": timezone.now()})
        old = "\n".join(row[0] for row in cursor.fetchall())
        assert "_pkey" not in old, old
        cursor.execute("EXPLAIN (FORMAT JSON) " + recovery._WAITING_SQL,
                       {"ids": ids[:100], "released_at": timezone.now()})
        (explained,) = cursor.fetchone()
        cursor.execute(recovery._WAITING_SQL, {"ids": ids[:100], "released_at": timezone.now()})
        assert cursor.fetchone() == (100,)
    scans = [node for node in _nodes(explained[0]["Plan"]) if DELIVERY_INDEX.match(node.get("Index Name", ""))]
    assert scans and all(node["Index Name"].endswith("_pkey") for node in scans), [
        (node["Index Name"], node.get("Index Cond")) for node in scans]
