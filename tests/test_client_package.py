"""The Python client (clients/python) against scripted local HTTP servers: what a real Herald will not
answer on cue (resets, hangs, a proxy's 502 page, every error code), how it encodes what it sends,
`verify()`, and that the package installs from its folder with its types and passes `mypy --strict`.

Its calls against the live API are in tests/test_client.py (and test_client_platform.py).
"""
import email.utils
import json
import subprocess
import sys
import time
import uuid
import zipfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import requests
import standardwebhooks

import herald_client
from herald_client import Herald, RetryInfo, RetryPolicy
from intake import problems
from tests.processes import free_port, run_dir
from tests.stub_http import Step, StubServer, problem, stubs  # noqa: F401 - stubs: a fixture
from tests.test_client import server  # noqa: F401 - the live API and a worker, started for this module
from webhooks.delivery.signing import generate_secret, webhook_headers

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "clients" / "python"
EVENT = {"id": "evt_1", "type": "invoice.paid", "data": {"invoice": "in_1"}, "channels": [],
         "created_at": "2026-01-01T00:00:00Z", "deliveries": []}


# Against the real API (the live server of tests/test_client.py) wherever Herald can be made to give the answer;
# a scripted stub (tests/stub_http.py) only where the point is an answer Herald cannot be made to give on cue (a
# reset, a hang, a 503 or 409 in progress at a given attempt, a proxy's page) or the bytes the client builds.
live = pytest.mark.django_db(transaction=True)


@pytest.fixture
def recording(server):  # noqa: F811 - the imported fixture
    """A recording proxy in front of the live API: every request forwarded to Herald unless `steps` say."""
    made = []

    def make(*steps: Step) -> StubServer:
        made.append(StubServer(*steps, upstream=server.url))
        return made[-1]

    yield make
    for proxy in made:
        proxy.close()


def _client(url: str, retries: list | None = None, **options) -> Herald:
    options.setdefault("retry", RetryPolicy(base_delay=0.01, max_delay=5))
    return Herald(url, "tok_test", on_retry=(retries if retries is not None else []).append, **options)


def _post(herald: Herald, **kwargs) -> dict:
    return herald.events.create("invoice.paid", {"invoice": "in_1"}, **kwargs)


# ------------------------------------------------------------------ what it retries, and how

def test_in_progress_is_retried_with_the_same_key_after_retry_after(stubs):
    # a stub: a 409 in progress at exactly the first attempt, then the answer (tests/test_client.py has Herald's own)
    stub = stubs(problem(409, "idempotency_key_in_progress", ("Retry-After", "1")), Step(202, EVENT))
    retries: list[RetryInfo] = []
    started = time.monotonic()
    event = _post(_client(stub.url, retries))

    assert event == EVENT
    assert time.monotonic() - started >= 1.0, "Retry-After is honoured"
    ((retry),) = retries
    assert (retry.status, retry.code, retry.delay, retry.attempt) == (409, "idempotency_key_in_progress", 1.0, 1)
    first_key, second_key = stub.keys()
    assert first_key == second_key == retry.idempotency_key and uuid.UUID(first_key)
    first, second = stub.requests
    assert first.headers["authorization"] == "Bearer tok_test"
    assert first.headers["content-type"] == "application/json"
    assert first.body == second.body, "identical bytes on every attempt"
    assert json.loads(first.body) == {"type": "invoice.paid", "data": {"invoice": "in_1"}}


def test_resets_timeouts_and_5xx_are_retried_with_backoff_and_the_same_key(stubs):
    # a stub: resets, a hang, 5xx and 429 in a given order are answers Herald cannot be made to give on cue
    stub = stubs(Step(reset=True), Step(hang=2.0), Step(500, {"detail": "boom"}),
                 problem(503, "unavailable", ("Retry-After", "0")), problem(429, "throttled"), Step(202, EVENT))
    retries: list[RetryInfo] = []
    herald = _client(stub.url, retries, timeout=0.5, retry=RetryPolicy(max_attempts=6, base_delay=0.1))
    event = _post(herald, idempotency_key="my-key-123")

    assert event == EVENT
    assert stub.keys() == ["my-key-123"] * 6
    assert len({recorded.body for recorded in stub.requests}) == 1
    assert [(r.status, type(r.error).__name__ if r.error else None) for r in retries] == [
        (None, "ConnectionError"), (None, "ReadTimeout"), (500, None), (503, None), (429, None)]
    # exponential with jitter: attempt n waits within [base·2^(n-1)/2, base·2^(n-1)], unless Retry-After says
    for retry in retries[:3] + retries[4:]:
        n = retry.attempt
        assert 0.1 * 2 ** (n - 1) / 2 <= retry.delay <= 0.1 * 2 ** (n - 1), (n, retry.delay)
    assert retries[3].delay == 0.0


def test_retry_after_as_an_http_date_and_capped_at_max_delay(stubs):
    # a stub: Herald sends Retry-After in seconds; an HTTP date comes from a proxy
    soon = email.utils.format_datetime(datetime.now(timezone.utc) + timedelta(seconds=3), usegmt=True)
    stub = stubs(problem(503, "x", ("Retry-After", soon)), problem(429, "throttled", ("Retry-After", "3600")),
                 Step(202, EVENT))
    retries: list[RetryInfo] = []
    _post(_client(stub.url, retries, retry=RetryPolicy(max_delay=0.3)))
    assert [retry.delay for retry in retries] == [0.3, 0.3]


def test_connection_refused_is_retried_until_the_server_is_up(stubs):
    # a stub: a server that comes up on a given port at the client's first retry
    port = free_port()  # nothing listens there yet
    started = []

    def on_retry(info: RetryInfo) -> None:
        if not started:
            started.append(stubs(Step(202, EVENT), port=port))

    event = Herald(f"http://127.0.0.1:{port}", "tok", on_retry=on_retry,
                   retry=RetryPolicy(base_delay=0.01)).events.create("invoice.paid", {})
    assert event == EVENT and len(started[0].requests) == 1


@live
def test_herald_s_4xx_answers_are_final_and_raised_as_their_code(recording, api):
    proxy = recording()
    herald = Herald(proxy.url, api.token, retry=RetryPolicy(base_delay=0.01, max_delay=5))
    herald.events.create("invoice.paid", {"n": 1}, idempotency_key="used-key-0001")
    calls = [
        (lambda: herald.endpoints.create("not a url"), herald_client.ValidationError, 400),
        (lambda: Herald(proxy.url, "hrld_not_a_token").endpoints.get("ep_1"), herald_client.NotAuthenticated, 401),
        (lambda: herald.endpoints.get("ep_00000000000000000000000000"), herald_client.NotFound, 404),
        (lambda: herald.events.create("invoice.paid", {"n": 2}, idempotency_key="used-key-0001"),
         herald_client.IdempotencyKeyReused, 409),
        (lambda: herald.events.create("invoice.paid", {"blob": "x" * (1 << 20)}), herald_client.PayloadTooLarge, 413),
    ]
    for call, error, status in calls:
        del proxy.requests[:]
        with pytest.raises(error) as raised:
            call()
        assert raised.value.status == status and raised.value.code == error.code and raised.value.attempts == 1
        assert [r.upstream_status for r in proxy.requests] == [status], "final: not retried"


# The codes the client cannot be made to get from Herald on cue here (a key Herald refuses but the client would
# not send, a tenant-less platform call, a recovery under way at that instant, a 415 for a client that always
# sends JSON, a 422 from another server): a stub answers them.
@pytest.mark.parametrize("step, error", [
    (problem(400, "idempotency_key_invalid"), herald_client.IdempotencyKeyInvalid),
    (problem(400, "tenant_required"), herald_client.TenantRequired),
    (problem(403, "forbidden"), herald_client.Forbidden),
    (problem(409, "conflict"), herald_client.Conflict),
    (problem(409, "recovery_in_progress"), herald_client.RecoveryInProgress),
    (problem(415, "unsupported_media_type"), herald_client.UnsupportedMediaType),
    (problem(422, "idempotency_key_reused"), herald_client.IdempotencyKeyReused),
], ids=lambda value: getattr(value, "__name__", None) or f"{value.status}")
def test_other_4xx_answers_are_final_and_raised_as_their_code(stubs, step, error):
    stub = stubs(step, Step(202, EVENT))
    retries: list[RetryInfo] = []
    with pytest.raises(error) as raised:
        _post(_client(stub.url, retries))

    assert (raised.value.status, raised.value.code, raised.value.detail) == (step.status, step.body["code"],
                                                                             step.body["code"])
    assert raised.value.idempotency_key == stub.keys()[0] and raised.value.attempts == 1
    assert len(stub.requests) == 1 and retries == []


def test_attempts_are_capped(stubs):
    # a stub: a 503 on every attempt
    stub = stubs(*[problem(503, "server_error")] * 5)
    with pytest.raises(herald_client.ServerError) as raised:
        _post(_client(stub.url, retry=RetryPolicy(max_attempts=3, base_delay=0.01)))
    assert raised.value.status == 503 and raised.value.attempts == 3 and len(stub.requests) == 3

    with pytest.raises(herald_client.HeraldConnectionError) as lost:
        _post(_client(f"http://127.0.0.1:{free_port()}", retry=RetryPolicy(max_attempts=2, base_delay=0.01)),
              idempotency_key="kept-key-1")
    assert lost.value.attempts == 2 and lost.value.idempotency_key == "kept-key-1"
    assert isinstance(lost.value.__cause__, requests.ConnectionError)


@live
def test_every_stable_code_has_its_class_and_the_error_carries_the_problem(server, api):  # noqa: F811
    codes = set(problems.TITLES)  # the server's stable codes, from the problems module
    assert codes <= set(herald_client.ERRORS_BY_CODE), codes - set(herald_client.ERRORS_BY_CODE)
    classes = {herald_client.ERRORS_BY_CODE[code] for code in codes}
    assert len(classes) == len(codes) and all(issubclass(cls, herald_client.APIError) for cls in classes)

    # the real API's problem, carried whole
    herald = Herald(server.url, api.token)
    with pytest.raises(herald_client.ValidationError) as raised:
        herald.endpoints.create("not a url")
    error = raised.value
    body = json.loads(error.body)
    assert (error.status, error.title, error.type) == (400, problems.TITLES["validation_error"], body["type"])
    assert body["code"] == "validation_error" and body["status"] == 400 and error.errors == body["errors"]
    assert "url" in error.errors and error.request_id == error.headers.get("X-Request-Id") and error.request_id
    assert "validation_error" in str(error) and error.errors["url"][0] in str(error)


def test_an_answer_that_is_not_problem_json_gets_the_class_of_its_status(stubs):
    # a stub: the point is a proxy's page, which Herald never gives
    stub = stubs()
    stub.steps = [Step(502, {}), Step(404, {})]
    stub.steps[0].body = {"not": "a problem"}
    with pytest.raises(herald_client.ServerError) as raised:
        _client(stub.url, retry=herald_client.NO_RETRIES).events.get("evt_1")
    assert raised.value.status == 502 and raised.value.code is None
    with pytest.raises(herald_client.NotFound):
        _client(stub.url).events.get("evt_1")


# ------------------------------------------------------------------ what it sends

@live
def test_a_key_per_write_none_on_reads_and_a_new_key_per_call(recording, api):
    endpoint_id = Herald(recording().upstream, api.token).endpoints.create("https://hooks.example.com/k")["id"]
    proxy = recording()
    herald = Herald(proxy.url, api.token)
    _post(herald)
    _post(herald)
    list(herald.events.list())
    herald.endpoints.update(endpoint_id, description="new", max_in_flight=None)
    herald.endpoints.delete(endpoint_id)

    assert [r.upstream_status for r in proxy.requests] == [202, 202, 200, 200, 204]  # Herald's answers
    first, second, listing, patch, delete = proxy.requests
    assert first.headers["idempotency-key"] != second.headers["idempotency-key"]
    assert "idempotency-key" not in listing.headers and "idempotency-key" not in delete.headers
    assert patch.method == "PATCH" and uuid.UUID(patch.headers["idempotency-key"])
    assert json.loads(patch.body) == {"description": "new", "max_in_flight": None}, "omitted fields are not sent"
    assert first.headers["user-agent"].startswith(f"herald-client-python/{herald_client.__version__} ")


def test_filters_and_ids_are_encoded(stubs):
    # a stub: the point is the request line the client builds, whatever answers it
    page = Step(200, {"data": [], "next_cursor": None})
    stub = stubs(page, page, page)
    herald = _client(stub.url)
    after = datetime(2026, 3, 1, 12, 0, tzinfo=timezone(timedelta(hours=2)))
    list(herald.deliveries.list(status="failed", endpoint="ep_1", created_after=after,
                                created_before="2026-03-02T00:00:00Z", limit=5))
    list(herald.events.list(type="invoice.paid", created_after=datetime(2026, 3, 1)))
    list(herald.tenant("acme:eu.1").endpoints.list())
    for unusable in ("..", ".", ""):
        with pytest.raises(ValueError):
            herald.tenant(unusable)

    paths = [recorded.path for recorded in stub.requests]
    assert paths == [
        "/api/v1/deliveries?status=failed&endpoint=ep_1&created_after=2026-03-01T10%3A00%3A00Z"
        "&created_before=2026-03-02T00%3A00%3A00Z&limit=5",
        "/api/v1/events?type=invoice.paid&created_after=2026-03-01T00%3A00%3A00Z",
        "/api/v1/tenants/acme%3Aeu.1/endpoints",
    ]


@live
def test_a_delete_whose_answer_was_lost_is_done_when_the_retry_finds_nothing(recording, api):
    # Herald deletes it; the proxy loses the answer (a reset); the retry finds nothing
    proxy = recording(Step(forward=True, reset=True))
    endpoint_id = Herald(proxy.upstream, api.token).endpoints.create("https://hooks.example.com/d")["id"]
    herald = Herald(proxy.url, api.token, retry=RetryPolicy(base_delay=0.01, max_delay=5))
    assert herald.endpoints.delete(endpoint_id) is None
    assert [(r.method, r.upstream_status) for r in proxy.requests] == [("DELETE", 204), ("DELETE", 404)]
    with pytest.raises(herald_client.NotFound):  # no earlier attempt: it was not there
        herald.endpoints.delete(endpoint_id)


@live
def test_pages_are_fetched_only_as_the_iteration_needs_them(recording, api):
    proxy = recording()
    herald = Herald(proxy.url, api.token)
    made = [_post(herald)["id"] for _ in range(3)]
    del proxy.requests[:]
    events = herald.events.list(limit=2)
    assert next(events)["id"] == made[2] and len(proxy.requests) == 1
    assert [event["id"] for event in events] == [made[1], made[0]]
    first, second = [r.path for r in proxy.requests]
    assert first == "/api/v1/events?limit=2"
    assert second.startswith("/api/v1/events?cursor=") and second.endswith("&limit=2")
    assert events.cursor is None and list(events) == []


def test_the_client_refuses_a_base_url_that_is_not_http():
    with pytest.raises(ValueError):
        Herald("127.0.0.1:8000", "tok")
    with pytest.raises(ValueError):
        Herald("http://127.0.0.1:8000", "")


# ------------------------------------------------------------------ verify() for receivers

def _signed(secrets: list[str], payload: dict | None = None, *, timestamp: float | None = None, msg_id="evt_v"):
    body = json.dumps(payload or {"type": "invoice.paid", "timestamp": "2026-01-01T00:00:00Z",
                                  "data": {"invoice": "in_1"}}).encode()
    return body, webhook_headers(secrets=secrets, msg_id=msg_id, timestamp=int(timestamp or time.time()), body=body,
                                 user_agent="Herald/test")


def test_verify_returns_the_payload_of_what_verifies():
    secret, old = generate_secret(), generate_secret()
    body, headers = _signed([secret])
    payload = herald_client.verify(body, {name.title(): value for name, value in headers.items()}, secret)
    assert payload == {"type": "invoice.paid", "timestamp": "2026-01-01T00:00:00Z", "data": {"invoice": "in_1"}}
    assert herald_client.verify(body.decode(), headers, [old, secret]) == payload, "any of several secrets"
    rotated_body, rotated = _signed([old, secret])  # Herald signs with both during a rotation
    assert herald_client.verify(rotated_body, rotated, old) == payload
    assert herald_client.WebhookVerifier(secret).verify(body, headers) == payload


@pytest.mark.parametrize("case", ["another secret", "tampered", "too old", "too new", "no signature",
                                  "garbled signature", "garbled timestamp", "not json", "not utf-8", "not an object"])
def test_verify_refuses_what_does_not_verify(case):
    secret = generate_secret()
    body, headers = _signed([secret])
    if case == "another secret":
        body, headers = _signed([generate_secret()])
    elif case == "tampered":
        body = body.replace(b"in_1", b"in_2")
    elif case in ("too old", "too new"):
        body, headers = _signed([secret], timestamp=time.time() + (-600 if case == "too old" else 600))
    elif case == "no signature":
        del headers["webhook-signature"]
    elif case == "garbled signature":
        headers["webhook-signature"] = "garbage"
    elif case == "garbled timestamp":
        headers["webhook-timestamp"] = "soon"
    elif case == "not json":
        body, headers = b"{not json", webhook_headers(secrets=[secret], msg_id="evt_v", timestamp=int(time.time()),
                                                      body=b"{not json", user_agent="t")
    elif case == "not utf-8":
        body, headers = b"\xff\xfe", webhook_headers(secrets=[secret], msg_id="evt_v", timestamp=int(time.time()),
                                                     body=b"\xff\xfe", user_agent="t")
    elif case == "not an object":
        body, headers = b"[1]", webhook_headers(secrets=[secret], msg_id="evt_v", timestamp=int(time.time()),
                                                body=b"[1]", user_agent="t")
    with pytest.raises(herald_client.WebhookVerificationError) as raised:
        herald_client.verify(body, headers, secret)
    # code written for the standardwebhooks package catches it too
    assert isinstance(raised.value, standardwebhooks.webhooks.WebhookVerificationError)
    assert isinstance(raised.value, herald_client.HeraldError)


def test_a_malformed_secret_is_refused_at_once():
    for secret in ("", "whsec_", [], "whsec_!!!not base64"):
        with pytest.raises(ValueError):
            herald_client.WebhookVerifier(secret)


# ------------------------------------------------------------------ the package itself

def test_the_package_is_typed_and_mypy_strict_clean():
    # the package's own configuration (clients/python/pyproject.toml: strict, the oldest Python it supports)
    own = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental"], cwd=PACKAGE, capture_output=True,
                         text=True, timeout=300)
    assert own.returncode == 0, own.stdout + own.stderr
    # and a user's code sees its types (py.typed): a mistake is caught, a right use passes
    user = run_dir("mypy-user") / "user.py"
    user.write_text(
        "from herald_client import Herald\n"
        "herald = Herald('http://127.0.0.1:8000', 'tok')\n"
        "event = herald.events.create('invoice.paid', {})\n"
        "event_id: str = event['id']\n"
        "count: int = event['type']\n"
        "for delivery in herald.deliveries.list(status='failed'):\n"
        "    attempts: int = delivery['attempt_count']\n")
    checked = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(user)],
                             capture_output=True, text=True, timeout=300)
    assert checked.returncode == 1, checked.stdout
    assert checked.stdout.count("error:") == 1 and 'user.py:5: error: Incompatible types in assignment' in checked.stdout


def test_the_package_builds_from_its_folder_with_its_types():
    out = run_dir("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out),
                    str(PACKAGE)], check=True, capture_output=True, timeout=300)
    (wheel,) = out.glob("herald_client-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = archive.read(next(name for name in names if name.endswith("METADATA"))).decode()
    assert {"herald_client/py.typed", "herald_client/client.py", "herald_client/webhooks.py",
            "herald_client/django/migrations/0001_initial.py",
            "herald_client/django/management/commands/herald_relay.py"} <= names
    assert f"Version: {herald_client.__version__}" in metadata
    requires = sorted(line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist"))
    assert [r for r in requires if "extra ==" not in r] == ["requests>=2.28", "standardwebhooks>=1.0"], (
        "two dependencies, no more")
    # the rest only with an extra: cryptography for v1a signatures, Django for the outbox (SPEC §13)
    assert [r.replace(" ", "") for r in requires if "extra ==" in r] == [
        'Django>=4.2;extra=="django"', 'cryptography>=41;extra=="ed25519"']
