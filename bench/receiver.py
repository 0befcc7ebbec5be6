"""A fast local webhook receiver for benchmarks: keep-alive, one write per answer, TCP_NODELAY.

`python -m bench.receiver PORT`; `GET /stats` returns {"count": N, "received": {webhook-id: first arrival}, "first": t, "last": t}.
"""
import http.server
import json
import sys
import threading
import time

received: dict[str, float] = {}  # first arrival per webhook-id
arrivals: list[float] = []  # every request
count = 0
lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def do_POST(self):
        global count
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        now = time.time()
        msg_id = self.headers.get("webhook-id", "")
        with lock:
            count += 1
            arrivals.append(now)
            received.setdefault(msg_id, now)
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    def do_GET(self):
        with lock:
            body = json.dumps({"count": count, "received": received,
                               "first": min(arrivals, default=0), "last": max(arrivals, default=0)}).encode()
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)

    def do_DELETE(self):
        global count
        with lock:
            received.clear()
            arrivals.clear()
            count = 0
        self.wfile.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")

    def log_message(self, *args):
        pass


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512


if __name__ == "__main__":
    Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
