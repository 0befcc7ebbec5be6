"""Tests for one HTTP delivery attempt, against real HTTP receivers on 127.0.0.1."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path

import pytest

from testkit.local_server import LocalServer, QuietHandler
from webhooks.delivery.destinations.http_transport import AttemptResult, ascii_url, check_url_host, is_public_address, send

TIMEOUT = 0.5
BODY = b'{"type":"test.ping","timestamp":"2026-11-29T23:41:22.000000Z","data":{}}'
HEADERS = {"content-type": "application/json", "webhook-id": "msg_test"}


@dataclass
class Call:
    path: str
    headers: dict[str, str]
    body: bytes
    client_port: int


Reply = tuple[int, dict[str, str], bytes]


@dataclass
class Receiver:
    url: str
    port: int
    calls: list[Call] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)


def _start_receiver(respond: Callable[[Call, Receiver], Reply]) -> tuple[Receiver, LocalServer]:
    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, so connection re-use is observable
        disable_nagle_algorithm = True
        timeout = 5  # an idle kept-alive connection does not pin a thread for long

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            call = Call(
                path=self.path,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=self.rfile.read(length),
                client_port=self.client_address[1],
            )
            receiver.calls.append(call)
            status, headers, body = respond(call, receiver)
            head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", f"Content-Length: {len(body)}"]
            head += [f"{k}: {v}" for k, v in headers.items()]
            # Headers and body in one write.
            self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)

    server = LocalServer(Handler, backlog=128)  # the default 5 makes a burst of connections wait for SYN retries
    receiver = Receiver(url=f"http://127.0.0.1:{server.port}/hook", port=server.port)
    return receiver, server


@pytest.fixture
def make_receiver() -> Iterator[Callable[[Callable[[Call, Receiver], Reply]], Receiver]]:
    started: list[tuple[Receiver, LocalServer]] = []

    def factory(respond: Callable[[Call, Receiver], Reply]) -> Receiver:
        started.append(_start_receiver(respond))
        return started[-1][0]

    yield factory
    for receiver, server in started:
        receiver.release.set()  # unblock any sleeping handler
        server.close()


def reply(status: int = 200, body: bytes = b"", **headers: str) -> Callable[[Call, Receiver], Reply]:
    return lambda call, receiver: (status, {k.replace("_", "-"): v for k, v in headers.items()}, body)


def deliver(url: str, *, allow_private_networks: bool = True, timeout: float = TIMEOUT) -> AttemptResult:
    return send(
        url=url,
        body=BODY,
        headers=HEADERS,
        timeout=timeout,
        allow_private_networks=allow_private_networks,
    )


def test_200_is_ok_with_body_excerpt(make_receiver):
    receiver = make_receiver(reply(200, b"thanks"))
    result = deliver(receiver.url)
    assert result.ok
    assert (result.status, result.body, result.error, result.retry_after) == (200, "thanks", "", None)
    assert 0 <= result.duration_ms < 2000
    [call] = receiver.calls
    assert call.body == BODY
    assert call.path == "/hook"
    assert call.headers["webhook-id"] == "msg_test"
    assert call.headers["content-type"] == "application/json"


def test_500_is_not_ok(make_receiver):
    receiver = make_receiver(reply(500, b"boom"))
    result = deliver(receiver.url)
    assert not result.ok
    assert (result.status, result.body, result.error) == (500, "boom", "")


def test_large_body_only_first_4096_bytes_recorded(make_receiver):
    receiver = make_receiver(reply(200, b"x" * 100_000))
    result = deliver(receiver.url)
    assert result.ok
    assert result.body == "x" * 4096


def test_invalid_utf8_body_is_replaced_not_raised(make_receiver):
    receiver = make_receiver(reply(200, b"ok \xff\xfe"))
    assert deliver(receiver.url).body == "ok \ufffd\ufffd"


def test_redirect_is_not_followed(make_receiver):
    target = make_receiver(reply(200, b"should not be reached"))
    receiver = make_receiver(reply(302, b"", Location=target.url))
    result = deliver(receiver.url)
    assert not result.ok
    assert result.status == 302
    assert result.error == "redirect_not_followed"
    assert len(receiver.calls) == 1
    assert target.calls == []


def test_slow_receiver_times_out_after_timeout(make_receiver):
    def slow(call: Call, receiver: Receiver) -> Reply:
        receiver.release.wait(10)  # released by the fixture's teardown
        return 200, {}, b"too late"

    receiver = make_receiver(slow)
    result = deliver(receiver.url)
    assert not result.ok
    assert result.status is None
    assert "timeout" in result.error
    assert TIMEOUT * 1000 * 0.9 <= result.duration_ms < TIMEOUT * 1000 + 500
    assert len(receiver.calls) == 1


def test_drip_feeding_receiver_is_cut_off_by_the_whole_attempt_deadline():
    # Every read gets data well within the read timeout, yet the attempt must end on time.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            while not stop.wait(0.1):
                try:
                    conn.sendall(b"x")
                except OSError:
                    return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        result = deliver(f"http://127.0.0.1:{port}/hook", timeout=0.5)
    finally:
        stop.set()
        listener.close()
        thread.join(2)
    assert result.status == 200
    assert not result.ok
    assert result.error.startswith("timeout")
    assert result.duration_ms < 1000


def test_connection_refused():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = deliver(f"http://127.0.0.1:{port}/hook")
    assert not result.ok
    assert result.status is None
    assert result.error.startswith("connection_error")
    assert "refused" in result.error.lower()


def test_loopback_is_blocked_unless_private_networks_allowed(make_receiver):
    receiver = make_receiver(reply(200, b"ok"))
    result = deliver(receiver.url, allow_private_networks=False)
    assert not result.ok
    assert result.status is None
    assert result.error.startswith("blocked_address")
    assert "127.0.0.1" in result.error
    assert receiver.calls == []


def test_hostname_resolving_to_loopback_is_blocked_at_connect_time(make_receiver):
    receiver = make_receiver(reply(200, b"ok"))
    result = deliver(f"http://localhost:{receiver.port}/hook", allow_private_networks=False)
    assert result.status is None
    assert result.error.startswith("blocked_address")
    assert receiver.calls == []


def test_loopback_is_delivered_when_private_networks_allowed(make_receiver):
    receiver = make_receiver(reply(204))
    result = deliver(receiver.url, allow_private_networks=True)
    assert result.ok
    assert result.status == 204
    assert len(receiver.calls) == 1


def test_connection_is_reused_between_sends(make_receiver):
    receiver = make_receiver(reply(200, b"ok"))
    assert deliver(receiver.url).ok
    assert deliver(receiver.url).ok
    assert deliver(receiver.url).ok
    ports = {call.client_port for call in receiver.calls}
    assert len(receiver.calls) == 3
    assert len(ports) == 1


def test_truncated_response_does_not_poison_the_next_request(make_receiver):
    receiver = make_receiver(reply(200, b"y" * 50_000))
    first = deliver(receiver.url)
    second = deliver(receiver.url)
    assert first.ok and second.ok
    assert second.body == "y" * 4096
    assert len(receiver.calls) == 2


def test_retry_after_is_captured(make_receiver):
    receiver = make_receiver(reply(503, b"busy", Retry_After="120"))
    result = deliver(receiver.url)
    assert not result.ok
    assert result.status == 503
    assert result.retry_after == "120"


def test_invalid_url_is_a_result_not_an_exception():
    result = deliver("not a url")
    assert result.status is None
    assert result.error


@pytest.mark.parametrize(
    "ip",
    ["127.0.0.1", "10.0.0.1", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1",
     "0.0.0.0", "224.0.0.1", "240.0.0.1", "255.255.255.255", "::1", "::", "fe80::1",
     "fc00::1", "fd12:3456::1", "fec0::1", "ff02::1", "::ffff:127.0.0.1", "::ffff:8.8.8.8",
     "2002:7f00:1::", "64:ff9b::7f00:1", "[::1]", "not-an-ip"],
)
def test_is_public_address_refuses_non_global(ip):
    assert not is_public_address(ip)


@pytest.mark.parametrize("ip", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "[2001:4860:4860::8888]"])
def test_is_public_address_accepts_global_unicast(ip):
    assert is_public_address(ip)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://localhost/",
        "http://10.0.0.1/",
        "http://100.64.0.1/",
        "http://[::1]:8080/",
        "http://2130706433/",  # 127.0.0.1 in decimal; resolved without any lookup
        "ftp://example.com/",
        "https:///nohost",
        "http://example.com:99999/",
    ],
)
def test_check_url_host_rejects(url):
    with pytest.raises(ValueError):
        check_url_host(url)


def test_check_url_host_error_is_clear():
    with pytest.raises(ValueError, match="non-public address 127.0.0.1"):
        check_url_host("http://127.0.0.1/")
    with pytest.raises(ValueError, match="scheme must be http or https"):
        check_url_host("ftp://example.com/")


@pytest.mark.parametrize("url", ["http://93.184.216.34/", "https://93.184.216.34:8443/hook", "https://[2606:4700:4700::1111]/"])
def test_check_url_host_accepts_global_literals(url):
    check_url_host(url)  # literals: no lookup, no traffic


def test_concurrent_sends_overlap_their_waits(make_receiver):
    # The worker's threads only overlap network waits if the transport releases the GIL while it waits.
    def slow(call: Call, receiver: Receiver) -> Reply:
        receiver.release.wait(0.4)
        return 200, {}, b"ok"

    receiver = make_receiver(slow)
    results: list[AttemptResult] = []
    threads = [threading.Thread(target=lambda: results.append(deliver(receiver.url, timeout=5))) for _ in range(40)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    elapsed = time.monotonic() - started
    assert [r.status for r in results] == [200] * 40
    assert elapsed < 2.0, f"40 sends to a 0.4 s receiver took {elapsed:.2f}s"


_SLOW_DNS_PROBE = """
import json, socket, sys, threading, time
sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sink.bind(("127.0.0.9", 53))  # the only name server: it reads every query and answers none
threading.Thread(target=lambda: [sink.recvfrom(2048) for _ in iter(int, 1)], daemon=True).start()
from webhooks.delivery.destinations.http_transport import send
started = time.monotonic()
result = send(url="http://slow-dns.herald-test.example/hook", body=b"{}", headers={}, timeout=1.0,
              allow_private_networks=False)
print(json.dumps({"elapsed": time.monotonic() - started, "error": result.error, "status": result.status}), flush=True)
import os
os._exit(0)  # not the normal exit: freeing the handle would wait out the abandoned 30 s lookup
"""


def test_a_name_server_that_never_answers_is_cut_off_by_the_deadline(tmp_path):
    # A private mount namespace whose /etc/resolv.conf names a silent server on 127.0.0.9; the
    # machine's own resolver configuration is never touched. Needs root, as CI has.
    if shutil.which("unshare") is None:
        pytest.fail("this test needs unshare(1) from util-linux")
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.9\noptions timeout:30 attempts:1\n")
    script = f"mount --bind {resolv} /etc/resolv.conf && exec {sys.executable} -c '{_SLOW_DNS_PROBE}'"
    out = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True, timeout=30,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["status"] is None
    assert result["error"].startswith("timeout"), result["error"]
    assert 0.9 <= result["elapsed"] < 1.5, result


def test_a_nul_byte_in_the_answer_is_replaced_so_the_attempt_can_be_stored(make_receiver):
    receiver = make_receiver(reply(200, b"ok\x00done"))
    assert deliver(receiver.url).body == "ok\ufffddone"


def test_a_url_with_non_ascii_characters_is_sent_encoded(make_receiver):
    receiver = make_receiver(reply(204))
    result = deliver(f"http://bücher.localhost:{receiver.port}/webhooks/straße?für=ü")  # libcurl: *.localhost is loopback
    assert result.ok, result.error
    [call] = receiver.calls
    assert call.path == "/webhooks/stra%C3%9Fe?f%C3%BCr=%C3%BC"


@pytest.mark.parametrize("url, expected", [
    ("https://hooks.example.com/a?b=c", "https://hooks.example.com/a?b=c"),
    ("https://Bücher.example/", "https://xn--bcher-kva.example/"),
    ("https://user:päss@bücher.example:8443/p%20q/ü", "https://user:p%C3%A4ss@xn--bcher-kva.example:8443/p%20q/%C3%BC"),
])
def test_ascii_url(url, expected):
    assert ascii_url(url) == expected
