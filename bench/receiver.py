"""A local webhook receiver for benchmarks, with the behaviours real receivers have, chosen by path.

`python -m bench.receiver PORT`. Paths:
- `/delay/<ms>/...`: answers 200 after that many milliseconds (an ordinary receiver doing some work);
- `/hang/...`: never answers; the request ends when the sender gives up and closes the connection;
- anything else: answers 200 at once (keep-alive, one write per answer, TCP_NODELAY).

`GET /stats` returns {"count": N, "received": {webhook-id: first arrival}, "first": t, "last": t,
"peak_in_flight": {group: n}} where a group is the first two path segments (`/delay/200`, `/hang`).
A request counts as in flight from its arrival until its answer is decided or its sender hangs up.
"""
import http.server
import json
import select
import sys
import threading
import time
from collections import defaultdict

received: dict[str, float] = {}  # first arrival per webhook-id
arrivals: list[float] = []  # every request
count = 0
in_flight: dict[str, int] = defaultdict(int)
peak_in_flight: dict[str, int] = defaultdict(int)
lock = threading.Lock()
HANG_LIMIT = 120.0


def _group(path: str) -> str:
    parts = path.split("/")
    return "/".join(parts[:3]) if len(parts) > 2 and parts[1] in ("delay", "hang") else "/"


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_POST(self):
        global count
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        now = time.time()
        msg_id = self.headers.get("webhook-id", "")
        group = _group(self.path)
        with lock:
            count += 1
            arrivals.append(now)
            received.setdefault(msg_id, now)
            in_flight[group] += 1
            peak_in_flight[group] = max(peak_in_flight[group], in_flight[group])
        try:
            if group.startswith("/hang"):
                # Readable means the sender closed the connection (it timed out): stop counting it.
                select.select([self.connection], [], [], HANG_LIMIT)
                self.close_connection = True
                return
            if group.startswith("/delay/"):
                time.sleep(int(group.rsplit("/", 1)[1]) / 1000)
        finally:
            with lock:
                in_flight[group] -= 1
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    def do_GET(self):
        with lock:
            body = json.dumps({"count": count, "received": received, "first": min(arrivals, default=0),
                               "last": max(arrivals, default=0), "peak_in_flight": peak_in_flight}).encode()
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)

    def do_DELETE(self):
        global count
        with lock:
            received.clear()
            arrivals.clear()
            peak_in_flight.clear()
            peak_in_flight.update({group: n for group, n in in_flight.items() if n})
            count = 0
        self.wfile.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")

    def log_message(self, *args):
        pass


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

    def handle_error(self, request, client_address):
        pass  # a sender giving up on /hang is the point


if __name__ == "__main__":
    Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
