"""`herald listen` (clients/python: herald_client.listen) run as a real subprocess against real gunicorn,
forwarding to real local HTTP servers: signed messages arrive as Herald signed them, in event order, one
line each; they are acknowledged once forwarded; an unreachable local server keeps them; SIGINT deletes
the endpoint it made."""
import json
import re
import signal
import sys
import time
import uuid

import pytest
import requests
from standardwebhooks import Webhook

from testkit.local_server import LocalServer, QuietHandler
from tests.conftest import subprocess_env, wait_until
from tests.processes import BIN, RUN_DIR, Process, free_port, gunicorn
from tests.receiver import Answer
from webhooks.models import Delivery, Endpoint, Event

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LINE = re.compile(r"^→ (\d{3}) in (\d+) ms  (evt_\w+) ([\w.]+)$", re.M)


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    process = gunicorn(free_port(), workers=1, threads=2)
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(autouse=True)
def _listen_logs_shown_secrets():
    """`herald listen` prints its endpoint's secret for the developer (SPEC §12); the session's check that
    no *Herald* process logs a secret (tests/conftest.py) is not about it: its logs are redacted after."""
    yield
    for path in RUN_DIR.glob("listen-*.log"):
        path.write_text(re.sub(r"whsec_\S+", "(the secret, shown to the developer)", path.read_text(errors="replace")))


# Starts a command with SIGINT ignored, as a shell's background job (`herald listen … &`) inherits it
SIGINT_IGNORED = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                  "os.execv(sys.argv[1], sys.argv[1:])"]


def listen(server, token, *args, via_module=False):
    """`herald listen` (the console script, started as a background job; or `python -m herald_client`)."""
    command = [sys.executable, "-m", "herald_client"] if via_module else [*SIGINT_IGNORED, str(BIN / "herald")]
    argv = [*command, "listen", "--api", server.url, "--token", token, *args]
    return Process("listen", argv, subprocess_env(), ready="Forwarding to")


def post_event(server, token, event_type, data):
    response = requests.post(f"{server.url}/api/v1/events", json={"type": event_type, "data": data}, timeout=10,
                             headers={"Authorization": f"Bearer {token}", "Idempotency-Key": str(uuid.uuid4())})
    assert response.status_code == 202, response.text
    return response.json()


def stop(process) -> int:
    process.popen.send_signal(signal.SIGINT)
    code = process.popen.wait(15)
    process.stop()
    return code


@pytest.mark.parametrize("via_module", [False, True], ids=["console-script", "python-m"])
def test_listen_forwards_signed_messages_in_order_and_deletes_its_endpoint_on_sigint(server, api, receiver,
                                                                                      via_module):
    # given `herald listen` for invoice events
    process = listen(server, api.token, "--forward-to", receiver.url("/local"), "--events", "invoice.*",
                     via_module=via_module)
    try:
        output = process.output()
        endpoint_id = re.search(r"Endpoint (ep_\w+)", output).group(1)
        secret = re.search(r"Signing secret (whsec_\S+)", output).group(1)
        endpoint = Endpoint.objects.get(pk=endpoint_id)
        assert endpoint.kind == "poll" and endpoint.event_types == ["invoice.*"]
        # when events are posted (one the endpoint does not take)
        events = [post_event(server, api.token, "invoice.paid", {"n": n, "text": "é"}) for n in range(3)]
        post_event(server, api.token, "customer.created", {})
        # then each invoice event reaches the local server as Herald signed it, in order
        got = receiver.wait_for(3, "/local", timeout=20)
        assert [r.headers["webhook-id"] for r in got] == [e["id"] for e in events]
        for received, event in zip(got, events):
            assert received.body == bytes(Event.objects.get(pk=event["id"]).payload)
            assert Webhook(secret).verify(received.body, received.headers)["data"] == event["data"]
        # one line per message, with the local answer's status and time
        wait_until(lambda: len(LINE.findall(process.output())) == 3)
        assert [(status, event_id, event_type) for status, _, event_id, event_type in LINE.findall(process.output())
                ] == [("200", e["id"], "invoice.paid") for e in events]
        # and, forwarded, they are acknowledged by its next read
        delivery_ids = [e["deliveries"][0]["id"] for e in events]
        wait_until(lambda: Delivery.objects.filter(pk__in=delivery_ids, status="succeeded").count() == 3)
        # when it is interrupted, it deletes the endpoint it made
        assert stop(process) == 0
        assert f"Deleted endpoint {endpoint_id}." in process.output()
        assert Endpoint.objects.get(pk=endpoint_id).deleted_at is not None
        answer = requests.get(f"{server.url}/api/v1/endpoints/{endpoint_id}", timeout=10,
                              headers={"Authorization": f"Bearer {api.token}"})
        assert answer.status_code == 404
    finally:
        process.stop()


def test_a_local_error_answer_is_shown_and_acknowledged(server, api, receiver):
    receiver.script("/local", 500)
    process = listen(server, api.token, "--forward-to", receiver.url("/local"))
    try:
        event = post_event(server, api.token, "invoice.paid", {})
        wait_until(lambda: LINE.findall(process.output()))
        assert LINE.findall(process.output())[0][0] == "500"
        delivery_id = event["deliveries"][0]["id"]
        wait_until(lambda: Delivery.objects.get(pk=delivery_id).status == "succeeded")
    finally:
        assert stop(process) == 0


class LateServer:
    """A local server that starts only when told to, on a port chosen beforehand."""

    def __init__(self):
        self.port = free_port()
        self.bodies = []
        self.server = None

    def start(self):
        bodies = self.bodies

        class Handler(QuietHandler):
            def do_POST(self):
                bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(204)
                self.end_headers()

        self.server = LocalServer(Handler, self.port)

    def close(self):
        if self.server:
            self.server.close()


def test_an_unreachable_local_server_keeps_the_messages_until_it_answers_in_order(server, api):
    local = LateServer()
    process = listen(server, api.token, "--forward-to", f"http://127.0.0.1:{local.port}/hook")
    try:
        events = [post_event(server, api.token, "invoice.paid", {"n": n}) for n in range(2)]
        # kept: listen tried again after the first failure (a later pass through the same path), acknowledging nothing
        wait_until(lambda: process.output().count("→ no answer") >= 2, timeout=30, message="a second failed forward")
        delivery_ids = [e["deliveries"][0]["id"] for e in events]
        assert Delivery.objects.filter(pk__in=delivery_ids, status="pending").count() == 2  # kept
        local.start()
        wait_until(lambda: len(local.bodies) == 2, timeout=30)
        assert [json.loads(body)["data"]["n"] for body in local.bodies] == [0, 1]
        wait_until(lambda: Delivery.objects.filter(pk__in=delivery_ids, status="succeeded").count() == 2)
        assert [status for status, *_ in LINE.findall(process.output())] == ["204", "204"]
    finally:
        assert stop(process) == 0
        local.close()


def test_a_given_poll_endpoint_is_used_and_kept(server, api, receiver):
    made = requests.post(f"{server.url}/api/v1/endpoints", json={"kind": "poll"}, timeout=10, headers={
        "Authorization": f"Bearer {api.token}", "Idempotency-Key": str(uuid.uuid4())}).json()
    process = listen(server, api.token, "--forward-to", receiver.url("/kept"), "--endpoint", made["id"])
    try:
        event = post_event(server, api.token, "invoice.paid", {})
        receiver.wait_for(1, "/kept")
        wait_until(lambda: LINE.findall(process.output()))
    finally:
        assert stop(process) == 0
    # kept, and what it forwarded is acknowledged on the way out
    assert Endpoint.objects.get(pk=made["id"]).deleted_at is None
    assert Delivery.objects.get(pk=event["deliveries"][0]["id"]).status == "succeeded"


def test_an_http_endpoint_or_a_missing_token_is_refused_with_a_sentence(server, api, receiver):
    http_endpoint = requests.post(f"{server.url}/api/v1/endpoints", json={"url": "https://hooks.example.com/x"},
                                  timeout=10, headers={"Authorization": f"Bearer {api.token}",
                                                       "Idempotency-Key": str(uuid.uuid4())}).json()
    import subprocess

    done = subprocess.run([str(BIN / "herald"), "listen", "--api", server.url, "--token", api.token,
                           "--forward-to", receiver.url(), "--endpoint", http_endpoint["id"]],
                          capture_output=True, text=True, timeout=30, env=subprocess_env())
    assert done.returncode == 2 and "is not a poll endpoint" in done.stdout
    env = {key: value for key, value in subprocess_env().items() if key != "HERALD_TOKEN"}
    done = subprocess.run([str(BIN / "herald"), "listen", "--forward-to", receiver.url()], capture_output=True,
                          text=True, timeout=30, env=env)
    assert done.returncode == 2 and "a token is needed" in done.stderr


def test_with_tenant_every_call_goes_under_the_tenants_path(server, receiver):
    """A platform credential acts for a tenant through /api/v1/tenants/{tenant}/… (SPEC §10): `listen --tenant`
    against the real API, through a recording proxy (tests/stub_http.py with an upstream: every request is
    forwarded to Herald and answered with Herald's answer) that shows which paths it called."""
    from urllib.parse import quote

    from tests.stub_http import StubServer
    from tests.test_client_platform import _platform_token

    token = _platform_token()
    auth = {"Authorization": f"Bearer {token}"}
    uid = f"cust:{uuid.uuid4().hex[:8]}"
    made = requests.post(f"{server.url}/api/v1/tenants", json={"name": "Cust", "uid": uid}, timeout=10,
                         headers={**auth, "Idempotency-Key": str(uuid.uuid4())})
    assert made.status_code == 201, made.text
    prefix = f"/api/v1/tenants/{quote(uid, safe='')}/"
    proxy = StubServer(upstream=server.url)
    process = Process("listen", [str(BIN / "herald"), "listen", "--api", proxy.url, "--token", token,
                                 "--tenant", uid, "--forward-to", receiver.url("/t")], subprocess_env(),
                      ready="Forwarding to")
    try:
        event = requests.post(f"{server.url}{prefix}events", json={"type": "invoice.paid", "data": {}}, timeout=10,
                              headers={**auth, "Idempotency-Key": str(uuid.uuid4())})
        assert event.status_code == 202, event.text
        (endpoint_id,) = [d["endpoint_id"] for d in event.json()["deliveries"]]
        got = receiver.wait_for(1, "/t", timeout=30)
        secret = requests.get(f"{server.url}{prefix}endpoints/{endpoint_id}/secret", headers=auth, timeout=10)
        Webhook(secret.json()["secret"]).verify(got[0].body, got[0].headers)
        assert got[0].headers["webhook-id"] == event.json()["id"]
        # the forward is acknowledged by the read after it; stopping before that read would race it
        wait_until(lambda: Delivery.objects.filter(endpoint_id=endpoint_id, status=Delivery.SUCCEEDED).exists(),
                   message="the read after the forward acknowledging it")
        assert stop(process) == 0
    finally:
        process.stop()
        proxy.close()
    paths = [(r.method, r.path.split("?")[0]) for r in proxy.requests]
    assert paths[:3] == [("POST", prefix + "endpoints"), ("GET", prefix + f"endpoints/{endpoint_id}/secret"),
                         ("GET", prefix + f"endpoints/{endpoint_id}/messages")]
    assert paths[-1] == ("DELETE", prefix + f"endpoints/{endpoint_id}")
    assert all(path.startswith(prefix) for _, path in paths)
    # Herald accepted every call (the long-poll under way at SIGINT is cut: no answer), and the page was
    # acknowledged by the read after it
    assert all(r.upstream_status < 400 for r in proxy.requests if r.upstream_status is not None), \
        [(r.method, r.path, r.upstream_status) for r in proxy.requests]
    assert any("after=" in r.path for r in proxy.requests if "/messages" in r.path)
    assert not Endpoint.objects.filter(pk=endpoint_id, deleted_at__isnull=True).exists()  # SIGINT deleted it


def test_what_a_hostile_server_sends_is_not_trusted(receiver):
    """A stand-in for a Herald that was taken over (or a proxy in front of it): `listen` forwards only the
    signature's headers and the content type, prints no terminal escape sequence it was sent, skips a message
    it cannot forward (a header with a line break) rather than holding up the ones after it, and shows a
    local redirect as an answer, without a traceback."""
    from tests.stub_http import Step, StubServer
    from webhooks.delivery.signing import generate_secret, webhook_headers

    secret = generate_secret()

    def message(n: int, event_type: str, **extra_headers: str) -> dict:
        body = json.dumps({"type": event_type, "timestamp": "2026-12-01T00:00:00.000000Z", "data": {"n": n}})
        headers = webhook_headers(secrets=[secret], msg_id=f"evt_{n}", timestamp=int(time.time()),
                                  body=body.encode(), user_agent="Herald/test")
        return {"delivery_id": f"dlv_{n}", "headers": {**headers, **extra_headers}, "body": body}

    hostile = message(1, "invoice.paid\x1b]0;owned\x07\x1b[2J", Host="evil.example", Authorization="Bearer stolen",
                      Cookie="session=stolen", **{"Transfer-Encoding": "chunked", "Content-Length": "5",
                                                  "X-Extra": "1"})
    broken = message(2, "invoice.paid")
    broken["headers"]["webhook-id"] = "evt_2\r\nX-Injected: 1"
    page = {"data": [hostile, broken, message(3, "invoice.paid"), message(4, "invoice.redirected")],
            "next_cursor": "1"}
    endpoint = {"id": "ep_1", "kind": "poll", "url": None, "event_types": ["\x1b[8m*"]}
    empty = [Step(200, {"data": [], "next_cursor": "1"}, hang=0.2) for _ in range(100)]
    stub = StubServer(Step(201, endpoint), Step(200, {"secret": secret + "\x1b[0m"}), Step(200, page), *empty)
    receiver.script("/t", 200, 200, Answer(302, (("Location", "http://[not-a-url"),), b""))
    process = Process("listen", [str(BIN / "herald"), "listen", "--api", stub.url, "--token", "hrld_x",
                                 "--forward-to", receiver.url("/t")], subprocess_env(), ready="Forwarding to")
    try:
        got = receiver.wait_for(3, "/t", timeout=30)
        wait_until(lambda: "evt_4" in process.output(), message="the line of the redirected message")
        wait_until(lambda: len(stub.requests) >= 4, message="the read after the page")
        assert stop(process) == 0
    finally:
        process.stop()
        stub.close()
    first, third, fourth = got
    assert set(first.headers) - {"host", "content-length", "connection", "accept", "accept-encoding", "user-agent"} \
        == {"webhook-id", "webhook-timestamp", "webhook-signature", "content-type"}
    assert first.headers["host"] == f"127.0.0.1:{receiver.port}" and "authorization" not in first.headers
    assert "cookie" not in first.headers and "transfer-encoding" not in first.headers
    assert first.headers["content-length"] == str(len(first.body))
    assert third.headers["webhook-id"] == "evt_3" and Webhook(secret).verify(third.body, third.headers)
    assert fourth.headers["webhook-id"] == "evt_4"
    output = process.output()
    assert "\x1b" not in output and "\x07" not in output
    assert "→ skipped  evt_2" in output and "X-Injected" in output and "POST /deliveries/dlv_2/retry" in output
    assert "→ 302 in" in output and "evt_4 invoice.redirected  (a redirect: not followed)" in output
    assert "Traceback" not in output
    assert "after=1" in stub.requests[3].path  # the page, the skipped message with it, was acknowledged
