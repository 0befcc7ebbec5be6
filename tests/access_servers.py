"""Real third parties for the endpoint access tests: a TLS receiver that can demand a client certificate
(trustme's CA), an OAuth2 token server that counts its token requests, and proxies from Debian's packages
(tinyproxy for HTTP, microsocks for SOCKS5), each run by the test."""
from __future__ import annotations

import base64
import json
import shutil
import socket
import ssl
import subprocess
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs

from testkit.local_server import LocalServer, QuietHandler
from testkit.processes import free_port


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: bytes
    client_subject: str | None = None


class TlsReceiver:
    """An HTTPS receiver on 127.0.0.1 with a certificate for `hostnames` from `ca`; with `client_ca`, it
    demands a client certificate issued by that CA (the handshake fails without one)."""

    def __init__(self, ca, *, hostnames=("localhost", "127.0.0.1"), client_ca=None):
        self.seen: list[Seen] = []
        receiver = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                peer = self.connection.getpeercert()
                subject = None
                if peer:
                    subject = ",".join(f"{k}={v}" for rdn in peer["subject"] for k, v in rdn)
                receiver.seen.append(Seen(self.path, {k.lower(): v for k, v in self.headers.items()}, body, subject))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ca.issue_cert(*hostnames).configure_cert(context)
        if client_ca is not None:
            client_ca.configure_trust(context)
            context.verify_mode = ssl.CERT_REQUIRED
        self._server = LocalServer(Handler, tls=context)
        self.port = self._server.port

    def url(self, host: str = "localhost", path: str = "/hook") -> str:
        return f"https://{host}:{self.port}{path}"

    def close(self):
        self._server.close()


@dataclass
class TokenRequest:
    form: dict[str, list[str]]
    client: tuple[str, str] | None  # from the Basic credentials
    content_type: str


@dataclass
class TokenServer:
    """An OAuth2 token endpoint (client credentials): answers `access_token` tok-1, tok-2, … valid for
    `expires_in` seconds to the client `client_id`/`client_secret`; `fail` scripts the next answers."""

    client_id: str = "herald-client"
    client_secret: str = "s3cret-client-value"
    expires_in: int | None = 3600
    requests: list[TokenRequest] = field(default_factory=list)
    fail: deque = field(default_factory=deque)  # (status, json body) answers to give first

    def __post_init__(self):
        server = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                client = None
                authorization = self.headers.get("Authorization", "")
                if authorization.startswith("Basic "):
                    user, _, password = base64.b64decode(authorization[6:]).decode().partition(":")
                    client = (user, password)
                server.requests.append(TokenRequest(parse_qs(body), client, self.headers.get("Content-Type", "")))
                if server.fail:
                    status, answer = server.fail.popleft()
                elif client != (server.client_id, server.client_secret):
                    status, answer = 401, {"error": "invalid_client"}
                else:
                    answer = {"access_token": f"tok-{len(server.requests)}", "token_type": "Bearer"}
                    if server.expires_in is not None:
                        answer["expires_in"] = server.expires_in
                    status = 200
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = LocalServer(Handler)
        self.port = self._server.port
        self.url = f"http://127.0.0.1:{self.port}/oauth/token"

    def close(self):
        self._server.close()


class Proxy:
    """A proxy from Debian's packages, run for the test: `tinyproxy` (HTTP, CONNECT) or `microsocks`
    (SOCKS5). `log()` is what it wrote about the connections it made."""

    def __init__(self, kind: str, directory: Path):
        self.port = free_port()
        self.kind = kind
        self._log = directory / f"{kind}.log"
        if kind == "http":
            binary = shutil.which("tinyproxy") or "/usr/bin/tinyproxy"
            config = directory / "tinyproxy.conf"
            # no ConnectPort line: CONNECT to any port (the receivers' ports are random)
            config.write_text(f'Port {self.port}\nListen 127.0.0.1\nTimeout 30\nLogFile "{self._log}"\n'
                              "LogLevel Connect\nMaxClients 100\nAllow 127.0.0.1\n")
            command = [binary, "-d", "-c", str(config)]
            self.url = f"http://127.0.0.1:{self.port}"
        else:
            binary = shutil.which("microsocks") or "/usr/bin/microsocks"
            command = [binary, "-i", "127.0.0.1", "-p", str(self.port)]
            self.url = f"socks5://127.0.0.1:{self.port}"
        if not Path(binary).exists():
            raise AssertionError(f"{binary} is missing: run scripts/test-deps (it installs tinyproxy and microsocks)")
        self._out = open(directory / f"{kind}.out", "wb")
        self._process = subprocess.Popen(command, stdout=self._out, stderr=subprocess.STDOUT)
        wait_for_port(self.port)

    def log(self) -> str:
        path = self._log if self.kind == "http" else Path(self._out.name)
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self):
        self._process.terminate()
        try:
            self._process.wait(5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._out.close()
