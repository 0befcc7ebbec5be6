"""The DNS lookup that checks an endpoint's host has a deadline of its own (ENDPOINT_DNS_TIMEOUT_SECONDS, 2 s):
against a real DNS server that never answers, creating or re-pointing an endpoint is a 400 within it, and the
API goes on answering meanwhile.

The API runs as `gunicorn config.wsgi`, in a mount namespace of its own (`unshare --mount`) whose
/etc/resolv.conf names that server: the system resolver (glibc, as libcurl uses at connect time) asks it and
waits, as it would for a dead or firewalled DNS server; the rest of the machine is untouched."""
import os
import shutil
import socket
import threading
import time
import uuid

import pytest
import requests

from tests.conftest import make_api, wait_until
from tests.processes import free_port, gunicorn, run_dir
from webhooks.models import Endpoint

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SILENT_DNS = "127.0.0.153"  # a loopback address of its own: port 53 on it is free whatever else runs here


@pytest.fixture
def silent_dns():
    """A DNS server on SILENT_DNS:53 (UDP and TCP) that takes every query and never answers; the queries it
    got, as raw bytes."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.fail("this test binds port 53 and runs gunicorn under `unshare --mount`: it needs root")
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((SILENT_DNS, 53))
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind((SILENT_DNS, 53))
    tcp.listen(16)
    queries: list[bytes] = []
    stop = threading.Event()

    def serve():
        udp.settimeout(0.1)
        while not stop.is_set():
            try:
                queries.append(udp.recvfrom(4096)[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield queries
    stop.set()
    thread.join(5)
    udp.close()
    tcp.close()


def test_a_host_whose_dns_never_answers_is_refused_within_the_deadline(processes, silent_dns):
    resolv = run_dir("resolv") / "resolv.conf"
    resolv.write_text(f"nameserver {SILENT_DNS}\noptions timeout:5 attempts:2\n")
    resolv.parent.chmod(0o755)
    launcher = ("unshare", "--mount", "sh", "-c", 'mount --bind "$0" /etc/resolv.conf && exec "$@"', str(resolv))
    web = processes(gunicorn(free_port(), workers=1, threads=4, launcher=launcher,
                             WEBHOOK_ALLOW_PRIVATE_NETWORKS="false"))
    api = make_api("acme")
    headers = {"Authorization": f"Bearer {api.token}"}

    def post(path: str, body: dict, method: str = "POST") -> tuple[requests.Response, float]:
        started = time.monotonic()
        response = requests.request(method, f"{web.url}/api/v1/{path}", json=body, timeout=30,
                                    headers={**headers, "Idempotency-Key": f"dns-{uuid.uuid4()}"})
        return response, time.monotonic() - started

    refused, took = post("endpoints", {"url": "https://hooks.silent-dns.example/in"})
    assert refused.status_code == 400, refused.text
    assert refused.json()["code"] == "validation_error"
    (message,) = refused.json()["errors"]["url"]
    assert "did not finish within 2 s" in message and "hooks.silent-dns.example" in message
    assert 1.9 <= took < 3.5, took
    assert any(b"silent-dns" in query for query in silent_dns), "the lookup never reached the DNS server"
    assert not Endpoint.objects.exists()

    # re-pointing an endpoint is checked the same way; the API answers others meanwhile
    created, _ = post("endpoints", {"url": "https://93.184.216.34/in"})  # a literal: no lookup
    assert created.status_code == 201, created.text
    health = []

    def check_health():
        # while the PATCH waits on the DNS server: its query has reached it
        wait_until(lambda: any(b"\x05other\x0asilent-dns" in query for query in silent_dns), timeout=10,
                   message="the PATCH's lookup to reach the DNS server")
        started = time.monotonic()
        answer = requests.get(f"{web.url}/healthz", timeout=10)
        health.append((answer.status_code, time.monotonic() - started))

    checker = threading.Thread(target=check_health)
    checker.start()
    moved, took = post(f"endpoints/{created.json()['id']}", {"url": "https://other.silent-dns.example/"}, "PATCH")
    checker.join(10)
    assert moved.status_code == 400 and "did not finish within 2 s" in moved.json()["errors"]["url"][0]
    assert 1.9 <= took < 3.5, took
    assert health and health[0][0] in (200, 503) and health[0][1] < 1.0, health
    assert Endpoint.objects.get().url == "https://93.184.216.34/in"
