"""A stand-in OTLP/HTTP collector for the tracing benchmark: `python -m bench.otlp_sink PORT`.

It takes every POST /v1/traces whole and answers an empty ExportTraceServiceResponse (zero bytes of
protobuf) without decoding it: the benchmark measures what exporting costs Herald's processes, not a
collector's work (which runs elsewhere in production). `GET /stats`: {"requests": N, "bytes": N}.
"""
import http.server
import json
import sys
import threading

stats = {"requests": 0, "bytes": 0}
lock = threading.Lock()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        size = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(size)
        with lock:
            stats["requests"] += 1
            stats["bytes"] += size
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        with lock:
            body = json.dumps(stats).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    server = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    print("otlp sink ready", flush=True)
    server.serve_forever()
