"""A local webhook receiver for benchmarks, with the behaviours real receivers have, chosen by path.

`python -m bench.receiver PORT`. Paths:
- `/delay/<ms>/...`: answers 200 after that many milliseconds (an ordinary receiver doing some work);
- `/hang/...`: never answers; the request ends when the sender gives up and closes the connection;
- `/failat/<n>,<m>,.../...`: answers 500 to the n-th, m-th... request to that path, 200 at once otherwise;
- `/fail/...`: answers 500 to every request, at once;
- anything else: answers 200 at once (keep-alive, one write per answer, TCP_NODELAY).

`GET /count` returns the number of requests so far (plain text); `GET /stats` returns {"count": N, "received": {webhook-id: first arrival}, "first": t, "last": t,
"peak_in_flight": {group: n}, "arrivals": {group: [t, ...]}, "first_ok": {group: [webhook-id, ...]}}
where a group is the first two path segments (`/delay/200`, `/hang`, `/failat/10,11,12`, `/fail/3`) or `/` and
first_ok lists webhook-ids in the order of their first 200.
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
group_arrivals: dict[str, list[float]] = defaultdict(list)
first_ok: dict[str, list[str]] = defaultdict(list)
answered_ok: set[tuple[str, str]] = set()
path_counts: dict[str, int] = defaultdict(int)
lock = threading.Lock()
HANG_LIMIT = 120.0


def _group(path: str) -> str:
    parts = path.split("/")
    return "/".join(parts[:3]) if len(parts) > 2 and parts[1] in ("delay", "hang", "failat", "fail") else "/"


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
            group_arrivals[group].append(now)
            path_counts[self.path] += 1
            status = 200
            if group.startswith("/failat/") and str(path_counts[self.path]) in group.split("/")[2].split(","):
                status = 500
            if group.startswith("/fail/"):
                status = 500
            if status == 200 and not group.startswith("/hang") and (group, msg_id) not in answered_ok:
                answered_ok.add((group, msg_id))
                first_ok[group].append(msg_id)
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
        if status == 500:
            self.wfile.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nboom")
        else:
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    def do_GET(self):
        if self.path == "/count":  # cheap to poll while a large run drains
            body = str(count).encode()
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            return
        with lock:
            body = json.dumps({"count": count, "received": received, "first": min(arrivals, default=0),
                               "last": max(arrivals, default=0), "peak_in_flight": peak_in_flight,
                               "arrivals": group_arrivals, "first_ok": first_ok}).encode()
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)

    def do_DELETE(self):
        global count
        with lock:
            received.clear()
            arrivals.clear()
            group_arrivals.clear()
            first_ok.clear()
            answered_ok.clear()
            path_counts.clear()
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
