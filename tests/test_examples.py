"""examples/client.py and examples/receiver.py, for real: against Herald and against local servers.

Both are built on the Python client (clients/python, `herald_client`), whose retry rules, errors and
verification tests/test_client*.py prove; here, what each example promises its reader:
- The client's command line: the event's JSON on stdout after retrying with one key, a problem's
  JSON and exit status 1 for what is refused.
- The receiver's verification and de-duplication with real signed requests.
- End to end: gunicorn, a Celery worker and beat, the example client posting, the example
  receiver receiving, and Herald re-sending the same webhook to prove de-duplication.
"""
import http.client
import importlib.util
import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests

import herald_client
from tests.conftest import create_endpoint, wait_until
from tests.processes import celery_beat, celery_worker, free_port, gunicorn
from tests.stub_http import Step, problem, stubs  # noqa: F401 - stubs: a fixture
from webhooks.models import Delivery
from webhooks.delivery.signing import generate_secret, webhook_headers
from webhooks.delivery import signing

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


# ------------------------------------------------------------------ the client's command line

def _run_client(url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "examples/client.py", "--url", url, "--token", "tok_cli", "--type", "invoice.paid",
         "--data", '{"invoice":"in_1"}', *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_the_command_line_prints_the_final_json(stubs):
    stub = stubs(problem(409, "idempotency_key_in_progress", ("Retry-After", "0")),
                 Step(202, {"id": "evt_cli", "type": "invoice.paid"}))
    result = _run_client(stub.url)

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"id": "evt_cli", "type": "invoice.paid"}
    assert "409" in result.stderr and "same key" in result.stderr
    assert len(set(stub.keys())) == 1 and len(stub.requests) == 2
    assert stub.requests[0].headers["authorization"] == "Bearer tok_cli"
    assert json.loads(stub.requests[0].body) == {"type": "invoice.paid", "data": {"invoice": "in_1"}}
    assert stub.requests[0].body == stub.requests[1].body, "identical bytes on every attempt"


def test_the_command_line_prints_a_refusal_and_fails(stubs):
    stub = stubs(problem(409, "idempotency_key_reused"))
    result = _run_client(stub.url, "--key", "my-own-key-1")

    assert result.returncode == 1
    assert json.loads(result.stdout)["code"] == "idempotency_key_reused"
    assert stub.keys() == ["my-own-key-1"], "a refusal is final: sent once, with the given key"


def test_the_command_line_gives_up_when_nothing_answers():
    result = _run_client(f"http://127.0.0.1:{free_port()}", "--max-attempts", "2")
    assert result.returncode == 1 and result.stdout == ""
    assert "attempt 1: ConnectionError" in result.stderr and "giving up" in result.stderr


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


@pytest.mark.parametrize("lengths,status", [
    (["-1"], 400), (["abc"], 400), (["+5"], 400), (["1_0"], 400), (["5", "6"], 400),
    (["99999999999"], 413),
])
def test_the_receiver_refuses_a_bad_content_length_before_reading(example_receiver, lengths, status):
    running = example_receiver()
    host, port = running.server.server_address[:2]
    with socket.create_connection((host, port), timeout=5) as connection:
        head = "POST /webhooks HTTP/1.1\r\nHost: x\r\n" + "".join(f"Content-Length:{v}\r\n" for v in lengths)
        # a few bytes of a body, and the connection left open: reading "the rest" would wait for ever
        connection.sendall(head.encode() + b"\r\n" + b"x" * 10)
        response = http.client.HTTPResponse(connection)
        response.begin()  # within the socket's 5 s, or the test fails with a timeout
        assert response.status == status
        assert json.loads(response.read())["error"] == ("bad Content-Length" if status == 400 else "body too large")
    assert running.processed == []


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
    herald_api = herald_client.Herald(herald.url, api.token)
    event = client.post_event(herald_api, "invoice.paid", {"invoice": "in_1"}, key=key)
    assert event["type"] == "invoice.paid" and event["data"] == {"invoice": "in_1"}

    # The worker delivers it; the receiver verifies and processes it once, with the right data.
    wait_until(lambda: running.processed, message="the receiver to process the event")
    ((webhook_id, payload),) = running.processed
    assert webhook_id == event["id"]
    assert payload["type"] == "invoice.paid" and payload["data"] == {"invoice": "in_1"}
    (delivery_ref,) = event["deliveries"]
    detail = wait_until(lambda: _delivery(api, delivery_ref["id"], "succeeded"), message="delivery succeeded")
    assert [attempt["response_status"] for attempt in detail["attempts"]] == [200]

    # The same event again with the same key is a replay: same event, nothing new is sent.
    again = client.post_event(herald_api, "invoice.paid", {"invoice": "in_1"}, key=key)
    assert again == event
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

    # The client does not retry what Herald refuses for good: it raises it.
    retries = []
    with pytest.raises(herald_client.NotAuthenticated) as refused:
        client.post_event(herald_client.Herald(herald.url, "not-a-token", on_retry=retries.append),
                          "invoice.paid", {"invoice": "in_1"})
    assert refused.value.status == 401 and refused.value.code == "not_authenticated" and retries == []


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_receiver_verifies_a_v1a_endpoint_with_its_public_key_alone(api, herald, example_receiver):
    """examples/receiver.py started with a v1a endpoint's `whpk_` public key (the receiver holds nothing that
    could sign) processes what Herald's worker signed with the private key, and refuses a v1 signature made
    with a secret, and a v1a signature made with another key."""
    port = free_port()
    endpoint = create_endpoint(api, f"http://127.0.0.1:{port}/webhooks", event_types=["invoice.*"], signature="v1a")
    assert endpoint["secret"].startswith("whpk_")
    running = example_receiver(secret=endpoint["secret"], port=port)
    event = api.send_event("invoice.paid", {"invoice": "in_v1a"})
    wait_until(lambda: running.processed, message="the receiver to process the v1a webhook")
    ((webhook_id, payload),) = running.processed
    assert webhook_id == event["id"] and payload["data"] == {"invoice": "in_v1a"}
    detail = wait_until(lambda: _delivery(api, event["deliveries"][0]["id"], "succeeded"), message="delivered")
    assert [attempt["response_status"] for attempt in detail["attempts"]] == [200]

    body, v1 = _signed(generate_secret(), "evt_forged", PAYLOAD)
    assert running.send(body, v1).status_code == 400
    body, v1a = _signed(signing.generate_signing_key(signing.V1A), "evt_forged", PAYLOAD)
    assert v1a["webhook-signature"].startswith("v1a,")
    assert running.send(body, v1a).status_code == 400
    assert [webhook_id for webhook_id, _ in running.processed] == [event["id"]]
