"""examples/client.py and examples/receiver.py, for real: against Herald and against local servers.

- The retry rules of the client against a scripted local HTTP server (409 in progress, 5xx,
  resets, timeouts, a port with nothing listening), and the 4xx answers it must not retry.
- The receiver's verification and de-duplication with real signed requests.
- End to end: gunicorn, a Celery worker and beat, the example client posting, the example
  receiver receiving, and Herald re-sending the same webhook to prove de-duplication.
"""
import importlib.util
import json
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from tests.conftest import create_endpoint, wait_until
from tests.processes import celery_beat, celery_worker, free_port, gunicorn
from webhooks.models import Delivery
from webhooks.signing import generate_secret, webhook_headers

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str):
    """Import examples/<name>.py by path, as the user runs it (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"herald_example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


client = _load("client")
receiver_example = _load("receiver")


# ------------------------------------------------------------------ a scripted intake stand-in

@dataclass
class Step:
    """One scripted answer: a status (with headers and a JSON body), a reset, or a hang."""
    status: int = 202
    body: dict = field(default_factory=lambda: {"id": "evt_stub"})
    headers: tuple[tuple[str, str], ...] = ()
    reset: bool = False
    hang: float = 0.0


def problem(status: int, code: str, *headers: tuple[str, str]) -> Step:
    return Step(status, {"type": "about:blank", "title": HTTPStatus(status).phrase, "status": status,
                         "detail": code, "code": code}, headers)


class StubIntake:
    """A local HTTP server answering POSTs from a script (then 202); records every request."""

    def __init__(self, *steps: Step, port: int = 0):
        self.steps = list(steps)
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with stub.lock:
                    stub.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                    step = stub.steps.pop(0) if stub.steps else Step()
                if step.reset:  # RST instead of an answer: "connection reset by peer"
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    self.close_connection = True
                    return
                if step.hang:
                    stub.stopping.wait(step.hang)
                data = json.dumps(step.body).encode()
                ctype = "application/problem+json" if step.status >= 400 else "application/json"
                head = [f"HTTP/1.1 {step.status} {HTTPStatus(step.status).phrase}", f"Content-Type: {ctype}",
                        f"Content-Length: {len(data)}", *(f"{k}: {v}" for k, v in step.headers)]
                try:
                    self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
                except OSError:
                    pass  # the client gave up waiting, as the test intended

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass

        self.server = Server(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def keys(self) -> list[str]:
        return [headers["idempotency-key"] for headers, _ in self.requests]

    def close(self):
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stubs():
    made = []

    def make(*steps: Step, port: int = 0) -> StubIntake:
        made.append(StubIntake(*steps, port=port))
        return made[-1]

    yield make
    for stub in made:
        stub.close()


class Sleeps(list):
    """Records the client's waits (and waits for real, but briefly), so the test can check them."""

    def __init__(self, then: Callable[[], None] | None = None):
        super().__init__()
        self.then = then

    def __call__(self, seconds: float):
        self.append(seconds)
        if self.then:
            self.then()
            self.then = None
        time.sleep(min(seconds, 0.05))


def _post(url, **kwargs) -> requests.Response:
    return client.post_event(url, "tok_test", "invoice.paid", {"invoice": "in_1"}, **kwargs)


# ------------------------------------------------------------------ client: what it retries

def test_in_progress_is_retried_with_the_same_key_after_retry_after(stubs):
    stub = stubs(problem(409, "idempotency_key_in_progress", ("Retry-After", "2")), Step(202, {"id": "evt_1"}))
    sleeps = Sleeps()
    response = _post(stub.url, sleep=sleeps)

    assert response.status_code == 202 and response.json() == {"id": "evt_1"}
    assert sleeps == [2.0], "Retry-After is honoured"
    (first_key, second_key) = stub.keys()
    assert first_key == second_key and uuid.UUID(first_key)
    (first, _), (second, _) = stub.requests
    assert first["authorization"] == "Bearer tok_test" and first["content-type"] == "application/json"
    assert stub.requests[0][1] == stub.requests[1][1], "identical bytes on every attempt"
    assert json.loads(stub.requests[0][1]) == {"type": "invoice.paid", "data": {"invoice": "in_1"}}


def test_resets_timeouts_and_5xx_are_retried_with_backoff_and_the_same_key(stubs):
    stub = stubs(Step(reset=True), Step(hang=2.0), Step(500, {"detail": "boom"}),
                 problem(503, "unavailable", ("Retry-After", "0")), Step(202, {"id": "evt_2"}))
    sleeps = Sleeps()
    response = _post(stub.url, key="my-key-123", timeout=0.5, base_delay=0.1, sleep=sleeps)

    assert response.status_code == 202 and response.json() == {"id": "evt_2"}
    assert stub.keys() == ["my-key-123"] * 5
    assert len({body for _, body in stub.requests}) == 1
    backoff, retry_after = sleeps[:3], sleeps[3]
    # exponential with jitter: attempt n waits within [base·2^(n-1)/2, base·2^(n-1)]
    for n, seconds in enumerate(backoff, start=1):
        assert 0.1 * 2 ** (n - 1) / 2 <= seconds <= 0.1 * 2 ** (n - 1), (n, seconds)
    assert retry_after == 0.0


def test_connection_refused_is_retried_until_the_server_is_up(stubs):
    port = free_port()  # nothing listens there yet
    started = []
    sleeps = Sleeps(then=lambda: started.append(stubs(Step(202, {"id": "evt_3"}), port=port)))
    response = _post(f"http://127.0.0.1:{port}", base_delay=0.01, sleep=sleeps)

    assert response.status_code == 202 and response.json() == {"id": "evt_3"}
    assert len(sleeps) == 1 and len(started[0].requests) == 1


@pytest.mark.parametrize("step", [
    problem(400, "validation_error"),
    problem(400, "idempotency_key_invalid"),
    problem(401, "not_authenticated"),
    problem(404, "not_found"),
    problem(409, "idempotency_key_reused"),
    problem(413, "payload_too_large"),
    problem(415, "unsupported_media_type"),
    problem(422, "idempotency_key_reused"),
], ids=lambda step: f"{step.status}-{step.body['code']}")
def test_other_4xx_answers_are_final(stubs, step):
    stub = stubs(step, Step(202))
    sleeps = Sleeps()
    response = _post(stub.url, sleep=sleeps)

    assert response.status_code == step.status
    assert response.json()["code"] == step.body["code"]
    assert len(stub.requests) == 1 and sleeps == []


def test_attempts_are_capped(stubs):
    stub = stubs(*[Step(503, {"detail": "down"})] * 5)
    response = _post(stub.url, max_attempts=3, base_delay=0.01, sleep=Sleeps())
    assert response.status_code == 503 and len(stub.requests) == 3

    with pytest.raises(requests.ConnectionError):
        _post(f"http://127.0.0.1:{free_port()}", max_attempts=2, base_delay=0.01, sleep=Sleeps())


def test_the_command_line_prints_the_final_json(stubs):
    stub = stubs(problem(409, "idempotency_key_in_progress", ("Retry-After", "0")),
                 Step(202, {"id": "evt_cli", "type": "invoice.paid"}))
    result = subprocess.run(
        [sys.executable, "examples/client.py", "--url", stub.url, "--token", "tok_cli", "--type", "invoice.paid",
         "--data", '{"invoice":"in_1"}'], cwd=ROOT, capture_output=True, text=True, timeout=60)

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"id": "evt_cli", "type": "invoice.paid"}
    assert "409" in result.stderr and "same key" in result.stderr
    assert len(set(stub.keys())) == 1 and len(stub.requests) == 2
    assert json.loads(stub.requests[0][1]) == {"type": "invoice.paid", "data": {"invoice": "in_1"}}


# ------------------------------------------------------------------ receiver: verify, de-duplicate

class RunningReceiver:
    """examples/receiver.py's server in a thread, recording what it processed."""

    def __init__(self, secret: str, fail_first: int = 0, port: int = 0):
        self.secret = secret
        self.processed: list[tuple[str, dict]] = []
        self.fail_first = fail_first
        self.server = receiver_example.make_server("127.0.0.1", port, secret, on_event=self.on_event)
        self.url = self.server.url
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def on_event(self, webhook_id: str, payload: dict):
        if self.fail_first:
            self.fail_first -= 1
            raise RuntimeError("database is down")
        self.processed.append((webhook_id, payload))

    def send(self, body: bytes, headers: dict[str, str], path: str = "/webhooks") -> requests.Response:
        return requests.post(self.url + path, data=body, headers=headers, timeout=10)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def example_receiver():
    made = []

    def make(secret: str | None = None, **kwargs) -> RunningReceiver:
        made.append(RunningReceiver(secret or generate_secret(), **kwargs))
        return made[-1]

    yield make
    for running in made:
        running.close()


def _signed(secret: str, msg_id: str, payload: dict, *, timestamp: float | None = None) -> tuple[bytes, dict]:
    body = json.dumps(payload, separators=(",", ":")).encode()
    headers = webhook_headers(secrets=[secret], msg_id=msg_id, timestamp=int(timestamp or time.time()), body=body,
                              user_agent="Herald/test")
    return body, headers


PAYLOAD = {"type": "invoice.paid", "timestamp": "2026-01-01T00:00:00Z", "data": {"invoice": "in_9"}}


def test_the_receiver_processes_a_webhook_once_however_often_it_arrives(example_receiver):
    running = example_receiver()
    body, headers = _signed(running.secret, "evt_dup", PAYLOAD)

    first, second = running.send(body, headers), running.send(body, headers)

    assert (first.status_code, first.json()) == (200, {"status": "processed"})
    assert (second.status_code, second.json()) == (200, {"status": "duplicate"})
    assert running.processed == [("evt_dup", PAYLOAD)]


def test_the_receiver_refuses_what_does_not_verify(example_receiver):
    running = example_receiver()
    body, headers = _signed(running.secret, "evt_bad", PAYLOAD)
    forged_body, forged = _signed(generate_secret(), "evt_bad", PAYLOAD)
    stale_body, stale = _signed(running.secret, "evt_bad", PAYLOAD, timestamp=time.time() - 600)

    cases = {
        "another secret": (forged_body, forged),
        "tampered body": (body.replace(b"in_9", b"in_8"), headers),
        "another webhook-id": (body, {**headers, "webhook-id": "evt_other"}),
        "too old": (stale_body, stale),
        "no signature": (body, {k: v for k, v in headers.items() if k != "webhook-signature"}),
        "garbled signature": (body, {**headers, "webhook-signature": "garbage"}),
    }
    for case, (data, sent_headers) in cases.items():
        response = running.send(data, sent_headers)
        assert response.status_code == 400, case
        assert "invalid webhook" in response.json()["error"], case
    assert running.processed == []
    assert running.send(body, headers).status_code == 200, "a bad copy does not mark the id as seen"
    assert running.processed == [("evt_bad", PAYLOAD)]


def test_a_failed_processing_is_retried_not_remembered(example_receiver):
    running = example_receiver(fail_first=1)
    body, headers = _signed(running.secret, "evt_retry", PAYLOAD)

    assert running.send(body, headers).status_code == 500
    assert running.send(body, headers).json() == {"status": "processed"}
    assert running.send(body, headers).json() == {"status": "duplicate"}
    assert running.processed == [("evt_retry", PAYLOAD)]


def test_the_receiver_command_line_prints_one_line_per_event():
    secret, port = generate_secret(), free_port()
    process = subprocess.Popen([sys.executable, "examples/receiver.py", "--port", str(port)], cwd=ROOT,
                               env={"PATH": "/usr/bin:/bin", "HERALD_WEBHOOK_SECRET": secret},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: _listening(port), timeout=20, message="the receiver to listen")
        body, headers = _signed(secret, "evt_cli", PAYLOAD)
        for _ in range(2):
            assert requests.post(f"http://127.0.0.1:{port}/webhooks", data=body, headers=headers,
                                 timeout=10).status_code == 200
    finally:
        process.terminate()
        out, err = process.communicate(timeout=10)
    assert out.splitlines() == ['evt_cli invoice.paid {"invoice": "in_9"}']
    assert f"http://127.0.0.1:{port}/" in err


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


# ------------------------------------------------------------------ end to end through Herald

@pytest.fixture(scope="module")
def herald(django_db_setup, django_db_blocker):
    """The API (gunicorn), a Celery worker and beat, on the test database and a private queue."""
    processes = []
    try:
        processes.append(gunicorn(free_port()))
        processes.append(celery_worker("examples"))
        processes.append(celery_beat())
        yield processes[0]
    finally:
        for process in processes:
            process.stop()


def _delivery(api, delivery_id: str, *statuses: str) -> dict | None:
    detail = api.get(f"deliveries/{delivery_id}").json()
    return detail if detail["status"] in statuses else None


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_examples_end_to_end(api, herald, example_receiver):
    # An endpoint at the example receiver, which then listens with the secret Herald generated.
    port = free_port()
    endpoint = create_endpoint(api, f"http://127.0.0.1:{port}/webhooks", event_types=["invoice.*"])
    running = example_receiver(secret=endpoint["secret"], port=port)

    # The example client posts one event through the real API.
    key = str(uuid.uuid4())
    response = client.post_event(herald.url, api.token, "invoice.paid", {"invoice": "in_1"}, key=key)
    assert response.status_code == 202, response.text
    event = response.json()
    assert event["type"] == "invoice.paid" and event["data"] == {"invoice": "in_1"}
    assert "Idempotent-Replay" not in response.headers

    # The worker delivers it; the receiver verifies and processes it once, with the right data.
    wait_until(lambda: running.processed, message="the receiver to process the event")
    ((webhook_id, payload),) = running.processed
    assert webhook_id == event["id"]
    assert payload["type"] == "invoice.paid" and payload["data"] == {"invoice": "in_1"}
    (delivery_ref,) = event["deliveries"]
    detail = wait_until(lambda: _delivery(api, delivery_ref["id"], "succeeded"), message="delivery succeeded")
    assert [attempt["response_status"] for attempt in detail["attempts"]] == [200]

    # The same event again with the same key is a replay: same event, nothing new is sent.
    again = client.post_event(herald.url, api.token, "invoice.paid", {"invoice": "in_1"}, key=key)
    assert again.status_code == 202 and again.headers["Idempotent-Replay"] == "true"
    assert again.json()["id"] == event["id"] and again.content == response.content
    assert Delivery.objects.filter(event_id=event["id"]).count() == 1

    # Herald sends the same webhook again (a manual retry): the receiver answers 200 but does
    # not process it a second time.
    assert api.post(f"deliveries/{delivery_ref['id']}/retry").status_code == 202
    detail = wait_until(lambda: (d := _delivery(api, delivery_ref["id"], "succeeded")) and len(d["attempts"]) == 2
                        and d, message="the second attempt")
    assert [attempt["response_status"] for attempt in detail["attempts"]] == [200, 200]
    assert "duplicate" in detail["attempts"][-1]["response_body"]
    assert [webhook_id for webhook_id, _ in running.processed] == [event["id"]]

    # Directly: the same signed webhook twice is processed once; a bad signature is 400.
    body, headers = _signed(endpoint["secret"], "evt_direct", PAYLOAD)
    assert running.send(body, headers).json() == {"status": "processed"}
    assert running.send(body, headers).json() == {"status": "duplicate"}
    _, forged = _signed(generate_secret(), "evt_direct_2", PAYLOAD)
    assert running.send(body, forged).status_code == 400
    assert [webhook_id for webhook_id, _ in running.processed] == [event["id"], "evt_direct"]

    # The client does not retry what Herald refuses for good.
    refused = client.post_event(herald.url, "not-a-token", "invoice.paid", {"invoice": "in_1"}, sleep=Sleeps())
    assert refused.status_code == 401 and refused.json()["code"] == "not_authenticated"
