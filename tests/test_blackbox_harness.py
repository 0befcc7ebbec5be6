"""The black-box harness's own logic, on hand-made inputs: its checks must fail when they should."""
import base64
import http.client
import time
from datetime import datetime, timezone

import pytest
from standardwebhooks import Webhook

from blackbox import checks, fuzz
from blackbox.__main__ import exit_code, render_table, select
from blackbox.client import Api, Reply, retryable
from blackbox.receivers import AlwaysOk, Flapping, Hit, Plan, Receiver
from blackbox.scenarios import Result

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()


# ---------------------------------------------------------------- table and exit code


def _row(name, **kwargs):
    row = Result(name, load="10 events", faults="none", inputs=10)
    for key, value in kwargs.items():
        setattr(row, key, value)
    return row


def test_the_table_has_one_line_per_scenario_and_lists_what_failed():
    ok = _row("storm")
    bad = _row("fuzz", lost=2, problems=["3× 500 for special:string:\\x00"], notes=["40 accepted"])
    table = render_table([ok, bad], broker="rabbitmq 3.10.8")
    broker, *lines = table.splitlines()
    assert broker == "broker: rabbitmq 3.10.8"
    assert lines[0].split(" | ")[0].strip() == "scenario"
    for column in ("load", "faults injected", "inputs tried", "executed twice", "lost", "result"):
        assert column in lines[0]
    assert lines[2].startswith("storm") and lines[2].rstrip().endswith("PASS")
    assert lines[3].startswith("fuzz") and lines[3].rstrip().endswith("FAIL")
    assert "✗ 3× 500 for special:string:\\x00" in table
    assert "· 40 accepted" in table


def test_long_cells_are_cut_so_the_table_stays_aligned():
    row = _row("broker-restart", load="x" * 200)
    lines = render_table([row]).splitlines()[1:]
    assert len(lines[2]) == len(lines[0])
    assert "…" in lines[2]


@pytest.mark.parametrize("field, value", [("lost", 1), ("executed_twice", 1), ("problems", ["boom"]),
                                          ("crashed", True)])
def test_anything_lost_twice_or_failed_makes_the_exit_code_non_zero(field, value):
    rows = [_row("storm"), _row("soak", **{field: value})]
    assert exit_code(rows, ["storm", "soak"], interrupted=False) == 1
    assert exit_code([_row("storm"), _row("soak")], ["storm", "soak"], interrupted=False) == 0


def test_a_run_that_did_not_finish_every_scenario_fails():
    assert exit_code([_row("storm")], ["storm", "soak"], interrupted=False) == 1
    assert exit_code([_row("storm")], ["storm"], interrupted=True) == 1


def test_scenario_selection_keeps_run_order_and_expands_aliases():
    assert select("soak,broker") == ["broker-restart", "broker-flush", "soak"]
    with pytest.raises(SystemExit):
        select("nonsense")
    assert select("platform") == ["storm-platform", "noisy-neighbour-platform"]


def test_a_platform_api_sends_tenant_paths_under_its_tenant_and_the_rest_as_they_are():
    api = Api("http://127.0.0.1:1", "token", tenant="acme:42")
    assert api.path("/api/v1/events") == "/api/v1/tenants/acme:42/events"
    assert api.path("/api/v1/endpoints/ep_1/secret") == "/api/v1/tenants/acme:42/endpoints/ep_1/secret"
    assert api.path("/api/v1/tenants") == "/api/v1/tenants"
    assert api.path("/healthz") == "/healthz"
    assert Api("http://127.0.0.1:1", "token").path("/api/v1/events") == "/api/v1/events"


# ---------------------------------------------------------------- attempt truthfulness


def _hit(answered, at, took=0.01, kind=None):
    plan = Plan(kind or ("hang" if answered is None else str(answered)), answered or 200)
    return Hit(webhook_id="evt_1", path="/", body=b"{}", headers={}, arrived=at, wall=at, plan=plan, verified=True,
               answered=answered, finished=at + took, client_gone=answered is None)


def _attempt(number, status, error=""):
    return {"number": number, "response_status": status, "error": error, "duration_ms": 10}


def _truth(hits, attempts, status):
    return checks.attempt_truth(hits, attempts, {"status": status, "attempt_count": len(attempts)},
                                schedule_len=3, timeout=2.0)


def test_a_truthful_history_passes():
    hits = [_hit(500, 0.0), _hit(None, 1.0, took=2.0), _hit(503, 4.0), _hit(200, 6.0)]
    attempts = [_attempt(1, 500), _attempt(2, None, "timeout: deadline of 2s exceeded"), _attempt(3, 503),
                _attempt(4, 200)]
    assert _truth(hits, attempts, "succeeded").problems == ()


def test_a_recorded_status_the_receiver_never_answered_is_caught():
    truth = _truth([_hit(503, 0.0), _hit(200, 1.0)], [_attempt(1, 500), _attempt(2, 200)], "succeeded")
    assert any("receiver answered 503" in p for p in truth.problems)


def test_a_hang_recorded_as_an_answer_is_caught():
    truth = _truth([_hit(None, 0.0, took=2.0), _hit(200, 3.0)], [_attempt(1, 200), _attempt(2, 200)], "succeeded")
    assert any("hang" in p for p in truth.problems)


def test_a_request_missing_from_the_attempts_is_caught():
    truth = _truth([_hit(500, 0.0), _hit(500, 1.0), _hit(200, 2.0)], [_attempt(1, 500), _attempt(2, 200)],
                   "succeeded")
    assert any("receiver saw 3 requests, 2 attempts" in p for p in truth.problems)


def test_failing_before_the_schedule_is_used_up_is_caught():
    hits = [_hit(500, 0.0), _hit(500, 1.0), _hit(500, 2.0)]
    attempts = [_attempt(1, 500), _attempt(2, 500), _attempt(3, 500)]
    assert any("schedule allows 4" in p for p in _truth(hits, attempts, "failed").problems)
    hits.append(_hit(500, 4.0))
    attempts.append(_attempt(4, 500))
    assert _truth(hits, attempts, "failed").problems == ()


def test_410_fails_at_once_and_success_must_be_the_last_attempt():
    assert _truth([_hit(410, 0.0)], [_attempt(1, 410)], "failed").problems == ()
    truth = _truth([_hit(200, 0.0), _hit(500, 1.0)], [_attempt(1, 200), _attempt(2, 500)], "succeeded")
    assert any("last attempt is not a 2xx" in p for p in truth.problems)
    assert _truth([_hit(500, 0.0)], [_attempt(1, 500)], "pending").problems == ("still pending at the end",)


def test_a_slow_answer_at_the_timeout_edge_is_tolerated_not_hidden():
    truth = _truth([_hit(200, 0.0, took=1.9), _hit(200, 3.0)],
                   [_attempt(1, None, "timeout: deadline of 2s exceeded"), _attempt(2, 200)], "succeeded")
    assert truth.problems == ()
    assert len(truth.tolerated) == 1


def test_a_retry_earlier_than_the_schedule_is_caught():
    hits = [_hit(500, 0.0), _hit(500, 0.5), _hit(200, 2.0)]
    problems = checks.retry_gap_problems(hits, (1, 1, 2), jitter=0.1)
    assert len(problems) == 1 and "retry 1" in problems[0]


# ---------------------------------------------------------------- intake answers


def _reply(status, body=b'{"id":"evt_1"}', replay=False, code=None, sent=0.0):
    if code:
        body = ('{"code":"%s"}' % code).encode()
    headers = {"idempotent-replay": "true"} if replay else {}
    return Reply(status, body, headers, "", sent, 0.01)


def test_replays_and_in_progress_answers_are_what_a_key_may_get():
    replies = [_reply(202, sent=0), _reply(409, code="idempotency_key_in_progress", sent=0.1),
               _reply(202, replay=True, sent=0.2)]
    assert checks.key_answer_problems(replies) == []


@pytest.mark.parametrize("bad, expected", [
    (_reply(202, body=b'{"id":"evt_2"}', replay=True, sent=1), "body differs"),
    (_reply(500, body=b"oops", sent=1), "unexpected answer 500"),
    (_reply(409, code="idempotency_key_reused", sent=1), "unexpected answer 409 idempotency_key_reused"),
    (_reply(202, sent=1), "without Idempotent-Replay"),
])
def test_any_other_answer_for_a_key_is_a_problem(bad, expected):
    problems = checks.key_answer_problems([_reply(202, sent=0), bad])
    assert any(expected in p for p in problems), problems


def test_a_key_without_any_202_is_a_problem():
    assert checks.key_answer_problems([_reply(409, code="idempotency_key_in_progress")])[0].startswith("no 202")


def test_two_events_for_one_key_count_as_executed_twice():
    events = {"k1": ["evt_a"], "k2": ["evt_b", "evt_c", "evt_d"]}
    assert checks.executed_twice(events) == {"k2": 2}
    assert checks.missing_keys({"k1", "k3"}, events) == {"k3"}


def test_the_client_retries_only_what_is_safe_to_retry():
    assert retryable(_reply(None))
    assert retryable(_reply(503))
    assert retryable(_reply(409, code="idempotency_key_in_progress"))
    assert not retryable(_reply(409, code="idempotency_key_reused"))
    assert not retryable(_reply(400, code="validation_error"))
    assert not retryable(_reply(202))


def test_a_growing_backlog_is_noticed():
    assert not checks.backlog_grew([0, 0, 0, 0, 1, 0, 0, 0])
    assert checks.backlog_grew([0, 0, 3, 8, 15, 30, 60, 90])
    assert not checks.backlog_grew([20, 20, 10, 5, 3, 2, 1, 0])


# ---------------------------------------------------------------- the fuzzer's model of SPEC §3


@pytest.mark.parametrize("raw, state, key", [
    (None, "missing", None),
    (b"abc", "invalid", None),
    (b"  key-12345678\t", "valid", "key-12345678"),
    (b'"quoted-key-\\"x\\""', "valid", 'quoted-key-"x"'),
    (b'"bad\\escape-key"', "invalid", None),
    (b'"quoted"junk-after', "invalid", None),
    ("key-é-12345".encode(), "invalid", None),
    (b"k" * 256, "invalid", None),
])
def test_the_key_model(raw, state, key):
    assert fuzz.model_key(raw) == (state, key)


def _input(**kwargs):
    base = dict(auth_kind="valid", auth="Bearer t", key_kind="valid", key_part="key-", content_type="application/json",
                body_kind="event", body=b'{"type":"a.b","data":{}}')
    base.update(kwargs)
    return fuzz.FuzzInput(**base)


def test_the_model_checks_auth_then_key_then_body():
    limit = 100
    key = b"key-12345678"
    # a body over the limit: the web server may refuse it unread, before authentication and the key
    assert fuzz.expected_outcome(_input(auth_kind="missing", body=b"x" * 500), None, limit) == \
        "not_authenticated|payload_too_large"
    assert fuzz.expected_outcome(_input(body=b"x" * 500), None, limit) == "idempotency_key_missing|payload_too_large"
    assert fuzz.expected_outcome(_input(auth_kind="missing", body=b"x" * 50), None, limit) == "not_authenticated"
    assert fuzz.expected_outcome(_input(body=b"x" * 500, content_type="text/plain"), key, limit) == "payload_too_large"
    assert fuzz.expected_outcome(_input(content_type="text/plain"), key, limit) == "unsupported_media_type"
    assert fuzz.expected_outcome(_input(body=b'{"a":'), key, limit) == "malformed"
    assert fuzz.expected_outcome(_input(body=b'{"a":NaN}'), key, limit) == "malformed"
    assert fuzz.expected_outcome(_input(content_type="application/vnd.x+json"), key, limit) == "?"  # Herald's choice
    assert fuzz.expected_outcome(_input(body=b""), key, limit) == "view"
    assert fuzz.expected_outcome(_input(body=b'{"s":"\\u0000"}'), key, limit) == "?"  # any 4xx, never a 5xx
    assert fuzz.expected_outcome(_input(body=b'{"s":"\\ud800"}'), key, limit) == "?"


def test_a_view_answer_to_a_request_the_model_rejects_is_a_mismatch():
    record = fuzz.FuzzRecord(inp=_input(), key_header=b"k" * 10, key_candidates=(), request_id="r", status=202)
    assert not fuzz.outcome_matches("unsupported_media_type", record)
    record.status, record.code = 415, "unsupported_media_type"
    assert fuzz.outcome_matches("unsupported_media_type", record)
    assert record.rejected_before_view and not fuzz.outcome_matches("view", record)


def test_the_http_servers_own_400_is_fair_only_for_odd_header_bytes():
    plain = fuzz.FuzzRecord(inp=_input(), key_header=b"key-12345678", key_candidates=(), request_id="r", status=400)
    assert plain.answered_by_gunicorn and not fuzz.outcome_matches("view", plain)
    odd = fuzz.FuzzRecord(inp=_input(headers=(("X-Odd", "caf\xe9"),)), key_header=b"key-12345678",
                          key_candidates=(), request_id="r", status=400)
    assert fuzz.outcome_matches("view", odd)


def test_valid_keys_are_unique_per_request_and_their_stored_forms_are_known():
    nonces = fuzz.Nonces("run1")
    first, second = nonces.next(), nonces.next()
    assert first != second
    header, candidates = fuzz.build_key(_input(key_kind="quoted", key_part='a"b'), first)
    assert header == f'"a\\"b{first}"'.encode()
    assert f'a"b{first}' in candidates


# ---------------------------------------------------------------- receivers


def _post(port, body, headers, timeout=5.0):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/hook/test", body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def _signed(body: bytes, secret=SECRET, msg_id="evt_test"):
    now = datetime.now(timezone.utc)
    signature = Webhook(secret).sign(msg_id, now, body.decode())
    return {"webhook-id": msg_id, "webhook-timestamp": str(int(now.timestamp())), "webhook-signature": signature,
            "content-type": "application/json"}


@pytest.fixture
def receiver():
    server = Receiver("test", AlwaysOk())
    server.secret = SECRET
    yield server
    server.close()


def test_a_receiver_records_a_valid_signature_as_verified(receiver):
    body = b'{"type":"a.b","timestamp":"t","data":{}}'
    assert _post(receiver.port, body, _signed(body)) == 200
    [hit] = receiver.snapshot()
    assert hit.verified and hit.answered == 200 and hit.webhook_id == "evt_test"
    assert receiver.succeeded_ids() == {"evt_test"}


def test_a_receiver_records_a_bad_signature_as_unverified(receiver):
    body = b'{"type":"a.b","timestamp":"t","data":{}}'
    other = "whsec_" + base64.b64encode(b"another-secret-another-secret-00").decode()
    _post(receiver.port, body, _signed(body, secret=other))
    tampered = _signed(body)
    _post(receiver.port, body + b" ", tampered)
    hits = receiver.snapshot()
    assert len(hits) == 2
    assert not any(hit.verified for hit in hits)
    assert len(receiver.unverified()) == 2
    assert receiver.succeeded_ids() == set()  # an unverified webhook never counts as delivered


def test_a_sender_giving_up_on_a_hang_is_recorded_as_no_answer():
    server = Receiver("hang", Flapping(timeout=0.2, ok=0, e500=0, e503=0, hang=1, slow=0))
    server.secret = SECRET
    try:
        body = b"{}"
        with pytest.raises(OSError):  # socket.timeout is an OSError
            _post(server.port, body, _signed(body), timeout=0.3)
        deadline = time.monotonic() + 3
        while server.snapshot()[0].finished is None and time.monotonic() < deadline:
            time.sleep(0.02)
        [hit] = server.snapshot()
        assert hit.plan.kind == "hang"
        assert hit.answered is None and hit.client_gone
        assert hit.finished - hit.arrived < 2.0  # noticed the sender leave, did not sleep out the hang
    finally:
        server.close()
